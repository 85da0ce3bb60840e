/*
 * dist_mpi.c - Open MPI, loaded when a program is started by mpirun (see
 * dist_internal.h, dist_mpi).
 *
 * The programs do not link libmpi: a process that runs alone (nearly every
 * run, and every run on a machine without Open MPI) neither needs nor loads
 * it.  Under mpirun the library is opened here (RTLD_GLOBAL: its own
 * plugins, loaded later, resolve its symbols) and its entry points and
 * predefined handles (MPI_COMM_WORLD and the datatypes are addresses of
 * Open MPI's globals, as its mpi.h defines them) taken by name.  The
 * types come from mpi.h at build time; the ABI is Open MPI's libmpi.so.40
 * (Debian's openmpi-bin / libopenmpi3).
 */
#include <dlfcn.h>
#include <string.h>

#include "model/dist/dist_internal.h"

#define DIST_LIBMPI "libmpi.so.40"

int dist_mpi_load(dist_mpi *m, ds4_err *err) {
    memset(m, 0, sizeof(*m));
    m->lib = dlopen(DIST_LIBMPI, RTLD_NOW | RTLD_GLOBAL);
    if (!m->lib)
        return ds4_err_set(err, DS4_ENOTFOUND,
                           "started by mpirun, but Open MPI's %s cannot be loaded: %s "
                           "(install openmpi-bin)",
                           DIST_LIBMPI, dlerror());
    struct {
        void *slot;
        const char *name;
    } fns[] = {
#define DIST_MPI_SYM(field, name) {(void *)&m->field, name}
        DIST_MPI_SYM(Init_thread, "MPI_Init_thread"),
        DIST_MPI_SYM(Initialized, "MPI_Initialized"),
        DIST_MPI_SYM(Query_thread, "MPI_Query_thread"),
        DIST_MPI_SYM(Finalize, "MPI_Finalize"),
        DIST_MPI_SYM(Abort, "MPI_Abort"),
        DIST_MPI_SYM(Comm_size, "MPI_Comm_size"),
        DIST_MPI_SYM(Comm_rank, "MPI_Comm_rank"),
        DIST_MPI_SYM(Comm_dup, "MPI_Comm_dup"),
        DIST_MPI_SYM(Comm_free, "MPI_Comm_free"),
        DIST_MPI_SYM(Comm_set_errhandler, "MPI_Comm_set_errhandler"),
        DIST_MPI_SYM(Isend, "MPI_Isend"),
        DIST_MPI_SYM(Irecv, "MPI_Irecv"),
        DIST_MPI_SYM(Test, "MPI_Test"),
        DIST_MPI_SYM(Get_count, "MPI_Get_count"),
        DIST_MPI_SYM(Testall, "MPI_Testall"),
        DIST_MPI_SYM(Cancel, "MPI_Cancel"),
        DIST_MPI_SYM(Request_free, "MPI_Request_free"),
        DIST_MPI_SYM(Allgather, "MPI_Allgather"),
        DIST_MPI_SYM(Bcast, "MPI_Bcast"),
        DIST_MPI_SYM(comm_world, "ompi_mpi_comm_world"),
        DIST_MPI_SYM(byte, "ompi_mpi_byte"),
        DIST_MPI_SYM(chr, "ompi_mpi_char"),
        DIST_MPI_SYM(flt, "ompi_mpi_float"),
        DIST_MPI_SYM(u32, "ompi_mpi_uint32_t"),
        DIST_MPI_SYM(request_null, "ompi_request_null"),
        DIST_MPI_SYM(errors_return, "ompi_mpi_errors_return"),
#undef DIST_MPI_SYM
    };
    for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
        void *p = dlsym(m->lib, fns[i].name);
        if (!p) {
            ds4_err_set(err, DS4_EUNSUPPORTED, "%s has no %s: not Open MPI's library", DIST_LIBMPI, fns[i].name);
            dlclose(m->lib);
            m->lib = NULL;
            return -1;
        }
        memcpy(fns[i].slot, &p, sizeof(p)); /* a function or a handle: both are the symbol's address */
    }
    return 0;
}
