# Sourced by the mpi tests: Open MPI as these tests run it. Tests run as root in CI, which
# mpirun refuses unless told; --oversubscribe lets 5 ranks share 2 cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Bazel's sandbox gives a private TMPDIR; Open MPI's session directory goes there.
export OMPI_MCA_orte_tmpdir_base="${TEST_TMPDIR:-/tmp}"
# No network plugins that probe for hardware this machine lacks (quiet, faster start).
export OMPI_MCA_btl="self,vader,tcp" OMPI_MCA_pml="ob1"
MPIRUN=(mpirun --oversubscribe --bind-to none)
