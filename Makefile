# ds4 - build.  See README.md.
#
#   make            CPU build of every program (./ds4, ./ds4-server, ...)
#   make cuda       the same programs with the CUDA backend (sm_90a + PTX)
#   make test       build and run the whole default test suite
#   make demo       build, generate a tiny model, run ds4 on it
#   make deps       install missing Debian packages (scripts/deps.sh)
#   make venv       Python environment for tests/reference scripts (pinned)
#
# Layout (dependencies point down): apps/ tools/ -> src/engine -> src/text,
# src/model -> src/format -> src/base.  Every .c under src/ goes into
# build/libds4.a; apps/NAME.c or apps/NAME/*.c (likewise tools/) becomes ./NAME.

CC      ?= cc
NVCC    ?= nvcc
PYTHON  ?= python3
BUILD   := build

WARN    := -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter
OPT     ?= -O2
CFLAGS  ?=
CFLAGS  += -std=gnu11 $(OPT) -g $(WARN) -fno-strict-aliasing -D_GNU_SOURCE -Isrc -pthread
DEPLIBS := -lpcre2-8 -ljansson -lmicrohttpd -ledit -lcrypto -lm -lpthread
LDFLAGS ?=

CUDA_ARCH  ?= -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90a,code=compute_90a
NVCCFLAGS  ?= -O3 -std=c++17 $(CUDA_ARCH) -Isrc -Xcompiler -Wall,-Wextra,-Werror,-Wno-unused-parameter,-fno-strict-aliasing -Werror all-warnings
CUDA_LIBS  := -lcudart -lcublas -lcublasLt

LIB_SRC   := $(shell find src -name '*.c' | sort)
LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CUDA_SRC  := $(shell find src -name '*.cu' | sort)
CUDA_OBJ  := $(CUDA_SRC:%.cu=$(BUILD)/cuda/%.o)
CUDA_LOBJ := $(LIB_SRC:%.c=$(BUILD)/cuda/%.o)

# Programs: single-file apps/tools and multi-file ones (a folder of .c files).
PROG_FILES := $(wildcard apps/*.c tools/*.c)
PROG_DIRS  := $(patsubst %/,%,$(wildcard apps/*/ tools/*/))
PROGS      := $(notdir $(PROG_FILES:.c=)) $(notdir $(PROG_DIRS))

TEST_SRC  := $(wildcard tests/unit/test_*.c)
TESTS     := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)
TEST_COMMON := $(wildcard tests/unit/common/*.c)

.PHONY: all cuda test test-cuda demo deps venv reference clean fuzz bench
all: $(PROGS)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libds4.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

define prog_rule
$(1): $$(if $$(wildcard $(2)/$(1).c),$(2)/$(1).c,$$(wildcard $(2)/$(1)/*.c)) $(BUILD)/libds4.a
	$$(CC) $$(CFLAGS) -o $$@ $$(filter %.c,$$^) $(BUILD)/libds4.a $$(LDFLAGS) $$(DEPLIBS)
endef
$(foreach p,$(notdir $(basename $(wildcard apps/*.c))) $(notdir $(patsubst %/,%,$(wildcard apps/*/))),$(eval $(call prog_rule,$(p),apps)))
$(foreach p,$(notdir $(basename $(wildcard tools/*.c))) $(notdir $(patsubst %/,%,$(wildcard tools/*/))),$(eval $(call prog_rule,$(p),tools)))

# Unit tests: one binary per tests/unit/test_*.c, linked with cmocka.
$(BUILD)/tests/%: tests/unit/%.c $(TEST_COMMON) $(BUILD)/libds4.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit -o $@ $< $(TEST_COMMON) $(BUILD)/libds4.a $(LDFLAGS) $(DEPLIBS) -lcmocka

# Server unit tests also link the server's own sources (all but main.c).
SERVER_SRC := $(filter-out apps/ds4-server/main.c,$(wildcard apps/ds4-server/*.c))
$(BUILD)/tests/test_server_%: tests/unit/test_server_%.c $(TEST_COMMON) $(SERVER_SRC) $(BUILD)/libds4.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit -Iapps/ds4-server -o $@ $< $(TEST_COMMON) $(SERVER_SRC) $(BUILD)/libds4.a $(LDFLAGS) $(DEPLIBS) -lcmocka

test: deps all $(TESTS)
	@scripts/run-tests.sh

# CUDA build: the library compiled with DS4_CUDA plus the kernels.
$(BUILD)/cuda/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DDS4_CUDA=1 -MMD -MP -c $< -o $@
$(BUILD)/cuda/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/libds4cuda.a: $(CUDA_LOBJ) $(CUDA_OBJ)
	@rm -f $@
	ar rcs $@ $^
cuda: $(BUILD)/libds4cuda.a
	@mkdir -p $(BUILD)/cuda/bin
	@for p in $(PROGS); do \
	  src=$$(ls apps/$$p.c tools/$$p.c apps/$$p/*.c tools/$$p/*.c 2>/dev/null); \
	  echo "  LINK $$p (cuda)"; \
	  $(NVCC) -O2 $(CUDA_ARCH) -Xcompiler "$(CFLAGS) -DDS4_CUDA=1" -x c $$src -x none -o $(BUILD)/cuda/bin/$$p \
	    $(BUILD)/libds4cuda.a $(LDFLAGS) $(DEPLIBS) $(CUDA_LIBS) || exit 1; \
	  cp $(BUILD)/cuda/bin/$$p ./$$p; \
	done

deps:
	@scripts/deps.sh

venv:
	@scripts/venv.sh

demo: deps all
	@scripts/demo.sh

clean:
	rm -rf $(BUILD) $(PROGS)

-include $(LIB_OBJ:.o=.d) $(CUDA_LOBJ:.o=.d) $(CUDA_OBJ:.o=.d)
