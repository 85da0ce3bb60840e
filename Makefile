# ds4 - build.  See README.md.
#
#   make            CPU build of every program (./ds4, ./ds4-server, ...)
#   make cuda       the same programs with the CUDA backend (sm_90a + PTX), in
#                   build/cuda/bin, plus the GPU test program
#   make cuda-dev   a developer build of it, in build/dev/cuda/bin: the same
#                   programs plus the profiling, ablation and graph-size
#                   switches (DS4_CUDA_PROFILE, DS4_CUDA_ABLATE,
#                   DS4_CUDA_GRAPH_CTX; docs/PERFORMANCE.md), which no
#                   release binary reads
#   make test       build and run the default test suite (scripts/run-tests.sh:
#                   unit tests, tests/suite/*.sh; under 15 minutes on 2 cores)
#   make test-cuda  the GPU tests, ds4 and ds4-server end to end included
#                   (needs an NVIDIA GPU; tests/cuda/run.sh)
#   make test-cuda-emu  the CUDA tests on the CPU emulation of CUDA (the
#                   default suite runs a subset of them)
#   make test-server-parallel  ds4-server with 32 sessions and 32 clients of
#                   the official SDKs at once, then 1,000 requests with its
#                   memory watched (needs PyPI for the SDKs; a few minutes)
#   make test-dist-link  the pipeline across two network namespaces joined by
#                   a veth pair (delays by tc netem, or by a relay over TUN
#                   devices where the kernel has no netem; a 1 Gb/s rate):
#                   tokens/s against the cost model (needs root; tests/link/run.sh)
#   make perf-tools the measuring instruments of tools/perf: the GPU probes
#                   built (needs nvcc), the scripts checked on fixtures
#   make demo       build, generate a tiny model, run ds4 on it
#   make deps       install missing Debian packages (scripts/deps.sh)
#   make venv       Python environment for tests/reference scripts (pinned)
#   make train-check  the small model's training pipeline on the CPU: a few
#                   steps of tools/train/train.py, then tools/train/check.sh
#                   (engine NLL = torch NLL; needs torch, transformers and
#                   tokenizers: TRAIN_PYTHON, default .venv/bin/python)
#
# Layout (dependencies point down): apps/ tools/ -> src/engine -> src/text,
# src/model -> src/format -> src/base; tools/ -> src/convert (conversion
# only) -> src/model.  Every .c under src/ goes into
# build/libds4.a; apps/NAME.c or apps/NAME/*.c (likewise tools/) becomes ./NAME.

CC      ?= cc
CXX     ?= g++
CUDA_HOME ?= /usr/local/cuda
NVCC    ?= $(CUDA_HOME)/bin/nvcc
PYTHON  ?= python3
BUILD   := build
NPROC   := $(shell nproc 2>/dev/null || echo 2)

WARN    := -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter
OPT     ?= -O2
CFLAGS  ?=
CFLAGS  += -std=gnu11 $(OPT) -g $(WARN) -fno-strict-aliasing -D_GNU_SOURCE -Isrc -pthread
# MPI (Debian's Open MPI, scripts/deps.sh): the pipeline across processes
# and hosts (src/model/dist, docs/DISTRIBUTED.md).  Its header only: the
# programs load libmpi when mpirun starts them (dist_mpi.c), so they run
# on machines without it.
MPI_CFLAGS := $(shell pkg-config --cflags ompi-c 2>/dev/null)
CFLAGS  += $(MPI_CFLAGS)
DEPLIBS := -lpcre2-8 -ljansson -lmicrohttpd -ledit -lcrypto -lm -lpthread
LDFLAGS ?=

CUDA_ARCH  ?= -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90a,code=compute_90a
NVCCFLAGS  ?= -O3 -std=c++17 $(CUDA_ARCH) -lineinfo -Isrc -Xcompiler -Wall,-Wextra,-Werror,-Wno-unused-parameter,-fno-strict-aliasing -Werror all-warnings
# CUDA_DEV=1 (set by `make cuda-dev`, which builds into a folder of its own
# so that its objects never mix with a release build's): -DDS4_CUDA_DEV.
ifneq ($(CUDA_DEV),)
ifeq ($(BUILD),build)
$(error CUDA_DEV=1 builds into build/dev: use `make cuda-dev`)
endif
NVCCFLAGS  += -DDS4_CUDA_DEV
endif
# Static CUDA runtime and C++ library: the programs run on any machine with
# the NVIDIA driver, whatever toolkit or compiler it has.
CUDA_LIBS  := -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -Wl,-Bstatic -lstdc++ -Wl,-Bdynamic -static-libgcc
# The CUDA emulation (tests/cuda/emu): the .cu sources compiled as C++, at
# -O3 (the kernels' loops: 7-11 % less time than -O2 in the emulated tests,
# the same results - no flag that reorders float arithmetic).
EMU_OPT      ?= -O3
EMU_CXXFLAGS := -std=c++17 $(EMU_OPT) -g -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter -Wno-unknown-pragmas -fno-strict-aliasing \
                -DDS4_CUDA_EMU -fno-omit-frame-pointer -Isrc -Itests/cuda/emu -pthread

LIB_SRC   := $(shell find src -name '*.c' | sort)
LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CUDA_SRC  := $(shell find src -name '*.cu' | sort)
CUDA_OBJ  := $(CUDA_SRC:%.cu=$(BUILD)/cuda/%.o)
CUDA_LOBJ := $(LIB_SRC:%.c=$(BUILD)/cuda/%.o)
EMU_OBJ   := $(CUDA_SRC:%.cu=$(BUILD)/emu/%.o) $(LIB_SRC:%.c=$(BUILD)/emu/%.o) $(BUILD)/emu/tests/cuda/emu/cuda_emu.o \
             $(BUILD)/emu/tests/cuda/emu/nccl_emu.o
CUDA_TEST_SRC := tests/cuda/test_cuda.c

# Programs: single-file apps/tools and multi-file ones (a folder of .c
# files); tools/perf holds measuring instruments (make perf-tools) and
# tools/train the small model's training scripts (Python), no program.
APP_PROGS  := $(notdir $(basename $(wildcard apps/*.c))) $(notdir $(patsubst %/,%,$(wildcard apps/*/)))
TOOL_PROGS := $(notdir $(basename $(wildcard tools/*.c))) $(notdir $(patsubst %/,%,$(filter-out tools/perf/ tools/train/,$(wildcard tools/*/))))
PROGS      := $(APP_PROGS) $(TOOL_PROGS)

TEST_SRC  := $(wildcard tests/unit/test_*.c)
TESTS     := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)
TEST_COMMON := $(wildcard tests/unit/common/*.c)

.PHONY: all cuda cuda-dev test test-cuda test-cuda-emu test-server-parallel test-dist-link perf-tools demo deps venv reference clean imatrix-dataset \
        train-check format
all: $(PROGS)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libds4.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

# Libraries only some programs need: LIBS_<program>.
LIBS_ds4-agent := -lcurl

define prog_rule
$(1): $$(if $$(wildcard $(2)/$(1).c),$(2)/$(1).c,$$(wildcard $(2)/$(1)/*.c) $$(wildcard $(2)/$(1)/*.h)) $(BUILD)/libds4.a
	$$(CC) $$(CFLAGS) -o $$@ $$(filter %.c,$$^) $(BUILD)/libds4.a $$(LDFLAGS) $$(DEPLIBS) $$(LIBS_$(1))
endef
$(foreach p,$(APP_PROGS),$(eval $(call prog_rule,$(p),apps)))
$(foreach p,$(TOOL_PROGS),$(eval $(call prog_rule,$(p),tools)))

# Unit tests: one binary per tests/unit/test_*.c, linked with cmocka.
$(BUILD)/tests/%: tests/unit/%.c $(TEST_COMMON) $(BUILD)/libds4.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit -o $@ $< $(TEST_COMMON) $(BUILD)/libds4.a $(LDFLAGS) $(DEPLIBS) -lcmocka

# Server unit tests also link the server's own sources (all but main.c).
SERVER_SRC := $(filter-out apps/ds4-server/main.c,$(wildcard apps/ds4-server/*.c))
$(BUILD)/tests/test_server_%: tests/unit/test_server_%.c $(TEST_COMMON) $(SERVER_SRC) $(BUILD)/libds4.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit -Iapps/ds4-server -o $@ $< $(TEST_COMMON) $(SERVER_SRC) $(BUILD)/libds4.a $(LDFLAGS) $(DEPLIBS) -lcmocka

# ds4-eval's tests link its sources (all but main.c); build/tests/ds4-eval-script
# is the whole program with scripted answers, for tests/suite/eval.sh.
EVAL_SRC := $(filter-out apps/ds4-eval/main.c,$(wildcard apps/ds4-eval/*.c))
EVAL_DEPS := $(EVAL_SRC) $(wildcard apps/ds4-eval/*.h)
$(BUILD)/tests/test_eval: tests/unit/test_eval.c $(TEST_COMMON) $(EVAL_DEPS) $(BUILD)/libds4.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit -Iapps/ds4-eval -o $@ $< $(TEST_COMMON) $(EVAL_SRC) $(BUILD)/libds4.a $(LDFLAGS) $(DEPLIBS) -lcmocka
$(BUILD)/tests/ds4-eval-script: tests/eval/main_script.c $(EVAL_DEPS) $(BUILD)/libds4.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Iapps/ds4-eval -o $@ $< $(EVAL_SRC) $(BUILD)/libds4.a $(LDFLAGS) $(DEPLIBS)

# The agent's tests link its sources (all but main.c) and the test script
# hook; build/tests/ds4-agent-script is the whole program with a scripted
# model, for tests/suite/agent.sh.
AGENT_SRC := $(filter-out apps/ds4-agent/main.c,$(wildcard apps/ds4-agent/*.c)) tests/agent/script.c
AGENT_DEPS := $(AGENT_SRC) $(wildcard apps/ds4-agent/*.h) tests/agent/script.h
$(BUILD)/tests/test_agent: tests/unit/test_agent.c $(TEST_COMMON) $(AGENT_DEPS) $(BUILD)/libds4.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit -Iapps/ds4-agent -Itests/agent -o $@ $< $(TEST_COMMON) $(AGENT_SRC) $(BUILD)/libds4.a $(LDFLAGS) $(DEPLIBS) $(LIBS_ds4-agent) -lcmocka
$(BUILD)/tests/ds4-agent-script: tests/agent/main_script.c $(AGENT_DEPS) $(BUILD)/libds4.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(AGENT_SRC) $(BUILD)/libds4.a $(LDFLAGS) $(DEPLIBS) $(LIBS_ds4-agent)

# The real DeepSeek V4 tokenizer as a GGUF, which the suite's tiny models
# carry: made once, before the items that use it run side by side
# (scripts/run-tests.sh).
$(BUILD)/tokenizer.gguf: data/tokenizer/deepseek-v4-tokenizer.json.xz ds4-tokenizer
	@mkdir -p $(BUILD)
	./ds4-tokenizer import $< $@

# The build on every core, in a make of its own started once deps has run
# (its packages installed, the flags that ask pkg-config for them are
# right): CI calls `make test` without -j, and a serial build was two of
# the suite's minutes on 2 cores.  A -j given to make stands.
test: deps
	@$(MAKE) --no-print-directory $(if $(findstring -j,$(MAKEFLAGS)),,-j$(NPROC)) all $(TESTS) $(BUILD)/tests/ds4-agent-script \
		$(BUILD)/tests/ds4-eval-script $(BUILD)/tokenizer.gguf
	@scripts/run-tests.sh

# CUDA build: the library compiled with DS4_CUDA plus the kernels; programs
# linked by the host compiler (only the libraries they use are recorded).
$(BUILD)/cuda/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DDS4_CUDA=1 -MMD -MP -c $< -o $@
$(BUILD)/cuda/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/libds4cuda.a: $(CUDA_LOBJ) $(CUDA_OBJ)
	@rm -f $@
	ar rcs $@ $^
CUDA_PROGS := $(addprefix $(BUILD)/cuda/bin/,$(PROGS))
define cuda_prog_rule
$(BUILD)/cuda/bin/$(1): $$(if $$(wildcard $(2)/$(1).c),$(2)/$(1).c,$$(wildcard $(2)/$(1)/*.c) $$(wildcard $(2)/$(1)/*.h)) $(BUILD)/libds4cuda.a
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS) -DDS4_CUDA=1 -o $$@ $$(filter %.c,$$^) $(BUILD)/libds4cuda.a $$(LDFLAGS) -Wl,--as-needed $$(DEPLIBS) $$(LIBS_$(1)) $(CUDA_LIBS)
endef
$(foreach p,$(APP_PROGS),$(eval $(call cuda_prog_rule,$(p),apps)))
$(foreach p,$(TOOL_PROGS),$(eval $(call cuda_prog_rule,$(p),tools)))
$(BUILD)/cuda/test_cuda: $(CUDA_TEST_SRC) tests/cuda/check.h $(BUILD)/libds4cuda.a
	$(CC) $(CFLAGS) -DDS4_CUDA=1 -o $@ $(CUDA_TEST_SRC) $(BUILD)/libds4cuda.a $(LDFLAGS) -Wl,--as-needed -lm -lpthread $(CUDA_LIBS)
$(BUILD)/cuda/test_cuda_kernels: tests/cuda/test_cuda_kernels.cu tests/cuda/check.h $(BUILD)/libds4cuda.a
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(BUILD)/libds4cuda.a -cudart static -Xcompiler -static-libstdc++,-static-libgcc
cuda: $(CUDA_PROGS) $(BUILD)/cuda/test_cuda $(BUILD)/cuda/test_cuda_kernels

test-cuda: cuda
	@tests/cuda/run.sh $(BUILD)/cuda gpu

cuda-dev:
	@$(MAKE) --no-print-directory cuda BUILD=$(BUILD)/dev CUDA_DEV=1

# Measuring instruments (tools/perf): the GPU probes, and the scripts'
# checks on fixtures (tools/perf/tests), kept working outside `make test`.
$(BUILD)/cuda/pdl_probe: tools/perf/pdl_probe.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -o $@ $< -cudart static -Xcompiler -static-libstdc++,-static-libgcc
$(BUILD)/cuda/gemv_probe: tools/perf/gemv_probe.cu $(BUILD)/libds4cuda.a
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(BUILD)/libds4cuda.a -cudart static -Xcompiler -static-libstdc++,-static-libgcc
perf-tools: $(BUILD)/cuda/pdl_probe $(BUILD)/cuda/gemv_probe
	@scripts/run-tests.sh tools/perf/tests/*.sh

# The same backend on the CPU emulation of CUDA (no GPU needed).
$(BUILD)/emu/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DDS4_CUDA=1 -MMD -MP -c $< -o $@
$(BUILD)/emu/%.o: %.cu
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -MMD -MP -x c++ -c $< -o $@
$(BUILD)/emu/%.o: %.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/libds4emu.a: $(EMU_OBJ)
	@rm -f $@
	ar rcs $@ $^
$(BUILD)/emu/test_cuda: $(CUDA_TEST_SRC) tests/cuda/check.h $(BUILD)/libds4emu.a
	$(CC) $(CFLAGS) -DDS4_CUDA=1 -o $@ $(CUDA_TEST_SRC) $(BUILD)/libds4emu.a $(LDFLAGS) -lm -lpthread -lstdc++
$(BUILD)/emu/test_cuda_kernels: tests/cuda/test_cuda_kernels.cu tests/cuda/check.h $(BUILD)/libds4emu.a
	$(CXX) $(EMU_CXXFLAGS) -x c++ -o $@ $< -x none $(BUILD)/libds4emu.a $(LDFLAGS) -lm
$(BUILD)/emu/test_emu: tests/cuda/emu/test_emu.cpp tests/cuda/check.h $(BUILD)/libds4emu.a
	$(CXX) $(EMU_CXXFLAGS) -o $@ $< $(BUILD)/libds4emu.a $(LDFLAGS) -lm
define emu_prog_rule
$(BUILD)/emu/bin/$(1): $$(if $$(wildcard $(2)/$(1).c),$(2)/$(1).c,$$(wildcard $(2)/$(1)/*.c)) $(BUILD)/libds4emu.a
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS) -DDS4_CUDA=1 -o $$@ $$(filter %.c,$$^) $(BUILD)/libds4emu.a $$(LDFLAGS) $$(DEPLIBS) $$(LIBS_$(1)) -lstdc++
endef
$(foreach p,$(APP_PROGS),$(eval $(call emu_prog_rule,$(p),apps)))
$(foreach p,$(TOOL_PROGS),$(eval $(call emu_prog_rule,$(p),tools)))
EMU_TEST_BINS := $(BUILD)/emu/test_cuda $(BUILD)/emu/test_cuda_kernels $(BUILD)/emu/test_emu \
                 $(addprefix $(BUILD)/emu/bin/,ds4 ds4-server ds4-tokenizer ds4-mkmodel ds4-forward)
test-cuda-emu: $(EMU_TEST_BINS)
	@tests/cuda/run.sh $(BUILD)/emu emu

test-server-parallel: all $(BUILD)/tokenizer.gguf
	@tests/server/run.sh test_sdk_parallel.py

test-dist-link: deps all
	@scripts/run-tests.sh tests/link/run.sh

deps:
	@scripts/deps.sh

venv:
	@scripts/venv.sh

# The training pipeline end to end on a model of the small one's
# architecture with every dimension small (docs/TRAINING.md).
TRAIN_PYTHON ?= .venv/bin/python
train-check: ds4
	@rm -rf $(BUILD)/train-check
	$(TRAIN_PYTHON) tools/train/train.py $(BUILD)/train-check --preset check --steps 4 --seq 160 --batch 2 \
	    --eval-every 4 --corpus-files 120 --device cpu
	sh tools/train/check.sh $(BUILD)/train-check

# The sources formatted by .clang-format (scripts/format.py; --check to list
# what would change).
format:
	@scripts/format.py

# The default imatrix calibration set (docs/TOOLCHAIN.md): the project's
# conversations plus its own code and documentation, all MIT.
imatrix-dataset: ds4-imatrix-dataset
	./ds4-imatrix-dataset -o $(BUILD)/imatrix-dataset --license MIT data/imatrix/conversations.jsonl \
		$(sort $(wildcard src/*/*.c src/*/*/*.c src/*/*/*.cu apps/*/*.c tools/*.c)) docs/*.md

demo: deps all
	@scripts/demo.sh

clean:
	rm -rf $(BUILD) $(PROGS)

-include $(LIB_OBJ:.o=.d) $(CUDA_LOBJ:.o=.d) $(CUDA_OBJ:.o=.d) $(EMU_OBJ:.o=.d)
