# The two commands a newcomer needs: `make demo` and `make test`. Each installs the Debian
# packages it needs (scripts/install-deps.sh), configures, builds, then runs.
PRESET ?= release
JOBS ?= $(shell nproc)

.PHONY: deps configure build demo test check-install test-asan test-tsan fuzz bench clean

deps:
	./scripts/install-deps.sh

configure: deps
	cmake --preset $(PRESET) >/dev/null

build: configure
	cmake --build --preset $(PRESET) -j $(JOBS)

demo: build
	./build/$(PRESET)/dtrain fit examples/configs/fashion_mnist.json

test: build
	ctest --preset $(PRESET) -j $(JOBS)

check-install: build
	PRESET=$(PRESET) ./scripts/check-install.sh

test-asan:
	$(MAKE) test PRESET=asan

test-tsan:
	$(MAKE) test PRESET=tsan

# Every reader of outside bytes under libFuzzer, briefly: the inputs it once failed on,
# then 10 s of fuzzing each (scripts/fuzz.sh runs longer).
fuzz:
	$(MAKE) test PRESET=fuzz

bench: build
	cmake --build --preset $(PRESET) --target benchmarks -j $(JOBS)
	./build/$(PRESET)/bench/bench_matmul
	./build/$(PRESET)/bench/bench_mlp_step

clean:
	rm -rf build
