"""torch_sh_test: one sh_test per supported PyTorch version, from one definition.

torch_sh_test(name = "x_test", ...) defines x_test_torch113 (Debian 12's PyTorch 1.13 in
/usr/bin/python3) and x_test_torch26 (PyTorch 2.6 in the Debian 13 root that
tests/testlib/torch26/setup.sh builds), each with TDIST_TORCH set to its version and tagged
torch113 / torch26, and a test_suite x_test holding both. The script sources
tests/testlib/torch.sh, which turns TDIST_TORCH into $PY (the interpreter to run) and checks it.
With torch_ext = True the test also gets tdist_torch's C++ group for that version.
"""

TORCH_VERSIONS = [
    ("torch113", "1.13"),
    ("torch26", "2.6"),
]

def torch_sh_test(name, env = {}, tags = [], data = [], torch_ext = False, **kwargs):
    """torch_ext: the test gets tdist_torch's C++ group built for its PyTorch
    (//runtime/torch:tdist_c_<suffix>), which torch.sh makes tdist_torch load and require."""
    tests = []
    for suffix, version in TORCH_VERSIONS:
        e = dict(env)
        e["TDIST_TORCH"] = version
        native.sh_test(
            name = name + "_" + suffix,
            env = e,
            tags = tags + [suffix, "torch"],
            data = data + ["//tests/testlib:torch"] + (["//runtime/torch:tdist_c_" + suffix] if torch_ext else []),
            **kwargs
        )
        tests.append(":" + name + "_" + suffix)
    native.test_suite(name = name, tests = tests, tags = tags)
