# latencyd developer entry points. Everything runs from the repo's .venv, which
# `make setup` (scripts/setup.sh) creates and keeps up to date; it is quiet when
# there is nothing to do, so every target can depend on it.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := test

VENV := .venv
PYTHON := $(VENV)/bin/python
CPUIDLE_DRIVER := /sys/devices/system/cpu/cpuidle/current_driver

.PHONY: setup run test test-vm check lint bench clean install install-system control-plane \
	vm-image test-lowest deb

setup:
	@bash scripts/setup.sh

# latencyd in the foreground on a private system-like D-Bus; Ctrl-C restores and stops.
run: setup
	@bash scripts/run-dev.sh

# $(call pytest,COMMAND): pytest's exit status 5 ("no tests collected") is a failure: a
# suite that ran nothing passed nothing.
pytest = status=0; $(1) || status=$$?; \
	if [ "$$status" -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	exit "$$status"

# The fleet tests' kube-apiserver and etcd, built once per machine into a cache
# (scripts/control-plane.sh: ~6-12 min the first time, seconds after).
control-plane:
	@bash scripts/control-plane.sh

# The VM tier's Debian image (scripts/vm/build-image.sh), built once per machine into a
# cache and again only when the recipe changes: ~6 min the first time, nothing after.
# It needs root (mmdebstrap, a loop device); as another user it is left out, and the VM
# tests skip.
vm-image:
	@if [ "$$(id -u)" = 0 ]; then bash scripts/vm/build-image.sh; \
	else echo "vm-image: not root: not built (the VM tests skip without root)"; fi

# The VM tier alone (tests/vm, the `vm` marker): a Debian VM under QEMU, latencyd installed
# in it by `make install` + `make install-system` from the commit at HEAD.
test-vm: setup
	@$(MAKE) --no-print-directory vm-tier

.PHONY: vm-tier test-host
vm-tier: vm-image
	@$(call pytest,$(PYTHON) -m pytest -p no:cacheprovider --durations=0 -m vm tests/vm)

# Everything on this machine: the host suites, and beside them the VM tier (its image
# built first, then `vm-tier` at nice 10 with its lines prefixed `vm| `, started before
# the fleet tests' control plane is built: the tier is the longer, mostly QEMU's CPU,
# and the host suites mostly wait, so side by side both end within CI's hour where one
# after the other would not). Either failing fails `make test`.
test: setup vm-image
	@set +e; \
	{ nice -n 10 $(MAKE) --no-print-directory vm-tier 2>&1 | sed -u 's/^/vm| /'; \
	  exit "$${PIPESTATUS[0]}"; } & tier=$$!; \
	$(MAKE) --no-print-directory control-plane && $(MAKE) --no-print-directory test-host; \
	host=$$?; \
	wait "$$tier"; vm=$$?; \
	if [ "$$vm" -ne 0 ]; then echo "make test: the VM tier failed (exit $$vm)" >&2; fi; \
	if [ "$$host" -ne 0 ]; then echo "make test: the host suites failed (exit $$host)" >&2; fi; \
	[ "$$host" -eq 0 ] && [ "$$vm" -eq 0 ]

# The host suites: pytest (kernel and e2e tests need root; tests/package builds the Debian
# package), then lint. On a machine with a cpuidle driver, the tests whose
# expectations depend on it run again as on a guest without one (what that changes:
# scripts/without-cpuidle-driver.sh); the unit tests run again with the lowest supported
# version of each dependency (test-lowest). PYTEST_ARGS go to the main pytest run only:
# `PYTEST_ARGS=--reverse CI=true bash .ci/run` is CI's run with the suite in reverse order
# (a test must not depend on what ran before it; the unit runs have no such option).
PYTEST_ARGS ?=
test-host:
	@$(call pytest,$(PYTHON) -m pytest $(PYTEST_ARGS))
	@if [ "$$(id -u)" = 0 ] && grep -qvx none $(CPUIDLE_DRIVER) 2>/dev/null; then \
	    echo "make test: the machine_kind tests as on a guest without a cpuidle driver"; \
	    $(call pytest,bash scripts/without-cpuidle-driver.sh \
	        $(PYTHON) -m pytest -m machine_kind -p no:cacheprovider); \
	fi
	@bash scripts/test-lowest.sh
	@$(MAKE) --no-print-directory lint-only

lint: setup
	@$(MAKE) --no-print-directory lint-only

# The unit tests and lint, as any user: no root, no daemon, nothing of the kernel written
# (the unit tests run on fake roots; --confcutdir leaves out tests/conftest.py, which
# snapshots the machine for the kernel and e2e tests). The tests run in two shards beside
# lint: many of them wait on a shell or a child. It sets up as whoever runs it: root is
# needed only for Debian packages that are missing, and setup says which
# (scripts/setup.sh); the perf bindings, which only the daemon's task events use, wait
# for `make setup` or `make test`.
check:
	@LATENCYD_SKIP_PERF=1 bash scripts/setup.sh
	@$(MAKE) --no-print-directory -j3 --output-sync=target unit-shard-0 unit-shard-1 lint-only

UNIT_SHARDS := unit-shard-0 unit-shard-1
.PHONY: $(UNIT_SHARDS)
$(UNIT_SHARDS): unit-shard-%:
	@$(call pytest,$(PYTHON) -m pytest -q -p no:cacheprovider --confcutdir=tests/unit --shard=$*/2 tests/unit)

# The unit tests against the lowest supported version of each run-time dependency
# (requirements-lowest.txt: Debian 12's, which the Debian package depends on), in a venv
# of their own, .venv-lowest (scripts/test-lowest.sh). `make test` runs it too.
test-lowest: setup
	@bash scripts/test-lowest.sh

.PHONY: lint-only
lint-only:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: setup
	$(PYTHON) -m bench

# Install for real, with the system's Python (not .venv): latencyd and latencyctl, their
# man pages (share/man) and bash and zsh completions (share/bash-completion, share/zsh),
# generated while building (see setup.py), and the Python packages they need at the
# versions requirements.lock pins. Run as root: `sudo make install`. Debian's pip puts
# it all under /usr/local (its --prefix=/usr/local would say /usr/local/local); set
# PREFIX elsewhere, and DESTDIR=/some/root to stage the install. Debian marks its Python
# "externally managed" (PEP 668): pip is allowed to install beside it, into /usr/local,
# never over Debian's own files. Never run by `make test`.
PREFIX ?=
SYSTEM_PYTHON ?= /usr/bin/python3
install:
	@$(SYSTEM_PYTHON) -m pip --version >/dev/null 2>&1 || { \
		echo "make install: $(SYSTEM_PYTHON) has no pip (apt-get install python3-pip)" >&2; exit 1; }
	PIP_BREAK_SYSTEM_PACKAGES=1 PIP_CONSTRAINT=$(CURDIR)/requirements.lock \
		$(SYSTEM_PYTHON) -m pip install --no-input \
		$(if $(PREFIX),--prefix=$(PREFIX)) $(if $(DESTDIR),--root=$(DESTDIR)) .

# The service: unit, D-Bus policy, tmpfiles entry and config into /etc, ExecStart= the
# installed latencyd, enabled (scripts/install-system.sh; DESTDIR= stages, LATENCYD=).
install-system:
	@bash scripts/install-system.sh

# The Debian package, built with dpkg-buildpackage from debian/ in a copy of the tree
# under build/deb: build/latencyd_VERSION_all.deb (scripts/build-deb.sh). DEB_VERSION=X
# builds version X (a higher one, to test an upgrade). Install: apt install ./build/latencyd_*.deb
DEB_VERSION ?=
deb:
	@DEB_VERSION=$(DEB_VERSION) bash scripts/build-deb.sh

clean:
	rm -rf $(VENV) .venv-lowest .perf-build build *.egg-info .mypy_cache .ruff_cache .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
