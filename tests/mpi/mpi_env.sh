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
# mpirun's ranks keep their shared-memory segments (vader_segment.*) in a directory of the
# test's own, removed when the test's shell exits, however it ends: mpirun removes its job's
# segments at the job's end, also after a rank is killed, but not when mpirun itself is killed
# (timeout -k, a bound that ran out), which left them in /dev/shm for good (seen: 2 segments of a
# 2-rank job after kill -9 of mpirun). Given on mpirun's command line, it reaches its ranks
# only: the agents these tests start give their ranks directories of their own (a setting in
# the environment would be every agent's, and two agents on one host then refuse it).
MPI_SHM_DIR="$(mktemp -d /dev/shm/tdist-mpitest.XXXXXX 2>/dev/null ||
  mktemp -d "${TEST_TMPDIR:-/tmp}/tdist-mpitest.XXXXXX")"
mpi_env_cleanup() { rm -rf "$MPI_SHM_DIR"; }
# (a test that sets its own EXIT trap later calls mpi_env_cleanup from it: pods_init does)
trap mpi_env_cleanup EXIT
trap 'exit 143' TERM # bash runs the EXIT trap on exit, not when a signal kills it
trap 'exit 130' INT
MPIRUN=(mpirun --oversubscribe --mca btl_vader_backing_directory "$MPI_SHM_DIR")
