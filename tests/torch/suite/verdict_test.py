"""verdict.py's rules and the expected-failures file, without running the suite.

    python3 verdict_test.py EXPECTED_FAILURES_TXT WORLD3_TXT
"""

import os
import random
import re
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import verdict  # noqa: E402

EXPECTED, WORLD3 = sys.argv[1], sys.argv[2]


def write(text):
    fd, path = tempfile.mkstemp(dir=os.environ.get("TEST_TMPDIR"))
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def rec(result, detail=""):
    return {"result": result, "detail": detail, "secs": 1.0}


class Rules(unittest.TestCase):
    def setUp(self):
        self.exp = {"test_listed": "DEFECT: x", "test_listed_passes": "NAME: y"}

    def judge(self, gloo, tdist):
        tests = sorted(gloo)
        return verdict.judge(tests, {"gloo": gloo, "tdist": tdist}, self.exp)

    def test_all_pass(self):
        rep = self.judge({"test_a": rec("pass")}, {"test_a": rec("pass")})
        self.assertTrue(rep["ok"])
        self.assertEqual(rep["pass"], ["test_a"])

    def test_unlisted_failure_fails(self):
        rep = self.judge({"test_a": rec("pass")}, {"test_a": rec("fail", "RuntimeError: boom")})
        self.assertFalse(rep["ok"])
        self.assertEqual(rep["unexpected"], ["test_a"])
        out = verdict.render(rep, {"gloo": {"test_a": rec("pass")},
                                   "tdist": {"test_a": rec("fail", "RuntimeError: boom")}}, "t")
        self.assertIn("FAIL test_a: gloo passes, tdist fail: RuntimeError: boom", out)
        self.assertTrue(out.endswith("verdict: FAIL"))

    def test_skip_on_tdist_where_gloo_passes_fails(self):
        rep = self.judge({"test_a": rec("pass")}, {"test_a": rec("skip")})
        self.assertFalse(rep["ok"])

    def test_missing_tdist_result_fails(self):
        rep = self.judge({"test_a": rec("pass")}, {})
        self.assertFalse(rep["ok"])

    def test_listed_failure_is_expected(self):
        rep = self.judge({"test_listed": rec("pass")}, {"test_listed": rec("fail")})
        self.assertTrue(rep["ok"])
        self.assertEqual(rep["expected"], ["test_listed"])

    def test_listed_test_that_passes_fails(self):
        rep = self.judge({"test_listed_passes": rec("pass")}, {"test_listed_passes": rec("pass")})
        self.assertFalse(rep["ok"])
        self.assertEqual(rep["stale"], ["test_listed_passes"])

    def test_gloo_failure_or_skip_not_compared(self):
        rep = self.judge({"test_a": rec("fail"), "test_b": rec("skip")}, {})
        self.assertTrue(rep["ok"])
        self.assertEqual(rep["gloo_fails"], ["test_a"])
        self.assertEqual(rep["skipped"], ["test_b"])

    def test_random_mix(self):
        rng = random.Random(os.environ.get("TDIST_TEST_SEED", "7"))
        gloo, tdist, bad = {}, {}, 0
        for i in range(200):
            name = "test_%d" % i
            g = rng.choice(["pass", "pass", "fail", "skip"])
            gloo[name] = rec(g)
            if g == "pass":
                d = rng.choice(["pass", "fail"])
                tdist[name] = rec(d)
                listed = rng.random() < 0.3
                if listed:
                    self.exp[name] = "REFUSED: r"
                bad += (d == "fail") != listed
        rep = self.judge(gloo, tdist)
        self.assertEqual(len(rep["unexpected"]) + len(rep["stale"]), bad)
        self.assertEqual(rep["ok"], bad == 0)


class ExpectedFile(unittest.TestCase):
    def test_filters_by_version_and_world(self):
        path = write("# c\n"
                     "test_a  *     *    REFUSED: sparse # not a comment here\n"
                     "test_b  2.6   *    DEFECT: x\n"
                     "test_c  *     3    NAME: y\n"
                     "test_d  1.13,2.6  2,3  WORDING: z\n")
        self.assertEqual(verdict.load_expected(path, "1.13", 2),
                         {"test_a": "REFUSED: sparse # not a comment here", "test_d": "WORDING: z"})
        self.assertEqual(sorted(verdict.load_expected(path, "2.6", 3)),
                         ["test_a", "test_b", "test_c", "test_d"])

    def test_bad_line_names_the_line(self):
        path = write("test_a * * because\n")
        with self.assertRaisesRegex(SystemExit, r":1: expected 'NAME TORCH WORLD REASON'.*because"):
            verdict.load_expected(path, "1.13", 2)

    def test_the_real_file_parses_and_gives_reasons(self):
        for torch in ("1.13", "2.6"):
            for world in (2, 3):
                exp = verdict.load_expected(EXPECTED, torch, world)
                self.assertTrue(exp)
                for name, reason in exp.items():
                    self.assertRegex(name, r"^test_\w+$")
                    self.assertRegex(reason, r"^(REFUSED|NAME|WORDING|DEFECT): \S")

    def test_world3_patterns_compile(self):
        with open(WORLD3) as f:
            pats = [ln.split("#", 1)[0].strip() for ln in f]
        pats = [p for p in pats if p]
        self.assertGreater(len(pats), 20)
        for p in pats:
            re.compile(p)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
