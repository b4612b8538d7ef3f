# One rank of one mpi4py test file (tests/mpi4py/mpi4py_suite.sh starts 4 of them under mpirun
# or tdist-agent). Loads test_<name>.py from mpi4py's own test/ directory as its runtests.py
# does (that directory first on sys.path; no CuPy, no Numba) and runs it with a result that
# appends one line per event to OUT.<rank>, flushed at once, so that a rank killed by the
# per-file timeout still says which test it was in:
#   start TEST_ID | ok TEST_ID | fail TEST_ID | error TEST_ID | skip TEST_ID | xfail TEST_ID
# and "done" when the file ended. The suite's own code is never copied here: it is read from
# the directory the developer gives (mpi4py's repository at the tag of the installed mpi4py).
#   python3 mpi4py_rank.py TESTDIR test_name OUT
import os
import sys
import unittest


def main():
    testdir, name, out = sys.argv[1], sys.argv[2], sys.argv[3]
    sys.path.insert(0, testdir)
    sys.modules["cupy"] = None
    sys.modules["numba"] = None
    from mpi4py import MPI

    rank = MPI.COMM_WORLD.Get_rank()
    log = open("%s.%d" % (out, rank), "a", buffering=1)

    def say(kind, test):
        log.write("%s %s\n" % (kind, test.id()))
        log.flush()

    class Result(unittest.TestResult):
        def startTest(self, test):
            say("start", test)
            super().startTest(test)

        def addSuccess(self, test):
            say("ok", test)
            super().addSuccess(test)

        def addFailure(self, test, err):
            say("fail", test)
            sys.stderr.write("[%d] FAIL %s\n%s\n" % (rank, test.id(), self._exc_info_to_string(err, test)))
            super().addFailure(test, err)

        def addError(self, test, err):
            say("error", test)
            sys.stderr.write("[%d] ERROR %s\n%s\n" % (rank, test.id(), self._exc_info_to_string(err, test)))
            super().addError(test, err)

        def addSkip(self, test, reason):
            say("skip", test)
            super().addSkip(test, reason)

        def addExpectedFailure(self, test, err):
            say("xfail", test)
            super().addExpectedFailure(test, err)

        def addUnexpectedSuccess(self, test):
            say("fail", test)
            super().addUnexpectedSuccess(test)

        def addSubTest(self, test, subtest, err):
            if err is not None:
                say("fail" if issubclass(err[0], test.failureException) else "error", test)
                sys.stderr.write("[%d] SUBTEST %s\n%s\n" % (rank, subtest.id(), self._exc_info_to_string(err, test)))
            super().addSubTest(test, subtest, err)

    try:
        module = __import__(name)
        suite = unittest.TestLoader().loadTestsFromModule(module)
    except Exception as e:  # an import error fails the file, not the rank's MPI job
        log.write("error %s.<import>\n" % name)
        sys.stderr.write("[%d] cannot load %s from %s: %r\n" % (rank, name, testdir, e))
        log.write("done\n")
        return 1
    suite.run(Result())
    log.write("done\n")
    log.close()
    return 0


if __name__ == "__main__":
    sys.dont_write_bytecode = True
    sys.exit(main())
