# Sourced by the mpi tests: Open MPI as these tests run it. Tests run as root in CI, which
# mpirun refuses unless told; --oversubscribe lets 5 ranks share 2 cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Bazel's sandbox gives a private TMPDIR; Open MPI's session directory goes there.
export OMPI_MCA_orte_tmpdir_base="${TEST_TMPDIR:-/tmp}"
# No network plugins that probe for hardware this machine lacks (quiet, faster start).
export OMPI_MCA_btl="self,vader,tcp" OMPI_MCA_pml="ob1"
# Under AddressSanitizer (the asan CI phase) memory errors are checked, leaks are not: Open MPI
# leaves thousands of allocations at exit whose stacks the fast unwinder cannot follow through
# its libraries (no frame pointers), and the slow unwinder that can (with lsan.supp naming Open
# MPI's libraries) makes these tests three times slower. To look for leaks of our own in MPI
# processes: ASAN_OPTIONS=fast_unwind_on_malloc=0 with LSAN_OPTIONS=suppressions=lsan.supp.
export OMPI_MCA_mca_base_component_disable_dlclose=1
# No PCI discovery in hwloc (MPI_Init in every rank, PMIx_server_init in the agent): these tests
# use no device, and under ASan it parses pci.ids through a growing realloc that its allocator
# makes quadratic, seconds of CPU per process (as tests/agent/pmix_test.sh found).
export HWLOC_COMPONENTS=-pci
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
MPIRUN=(mpirun --oversubscribe)
