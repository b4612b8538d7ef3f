"""agent_sh_test: an end-to-end test of tdist-agent (tests/agent/*.sh) from one line of what it runs.

agent_sh_test(name = "x_test", size = ..., runs = [LABEL, ...]) defines the sh_test x_test of the
script x_test.sh (or `src`), whose arguments are `first_args` then the path of each label of `runs`,
in order, and whose data are those labels and `helpers` (the tests/testlib shell files it sources),
in buildifier's order, and lib.sh (the pass/fail/APID bookkeeping every such script sources). Tags: "agent" (unless agent = False), "exclusive" (exclusive = True), then
`tags`. torch = True makes it a torch_sh_test (tests/testlib/torch.bzl: one test per PyTorch
version, x_test_torch113 and x_test_torch26, and the suite x_test). env as sh_test's.
"""

load("//tests/testlib:torch.bzl", "torch_sh_test")

def _label_key(label):
    """buildifier's order of a label list: files of the package, then :targets, then //, then @."""
    if label.startswith("@"):
        phase = 3
    elif label.startswith("//"):
        phase = 2
    elif label.startswith(":"):
        phase = 1
    else:
        phase = 0
    pkg, _, name = label.partition(":")
    return (phase, pkg, name)

def agent_sh_test(name, size, runs, helpers = [], first_args = [], src = None, env = None, agent = True,
                  exclusive = False, tags = [], torch = False):
    all_tags = (["agent"] if agent else []) + (["exclusive"] if exclusive else []) + tags
    kwargs = {}
    if env != None:
        kwargs["env"] = env
    if all_tags:
        kwargs["tags"] = all_tags
    (torch_sh_test if torch else native.sh_test)(
        name = name,
        size = size,
        srcs = [src or name + ".sh"],
        args = first_args + ["$(location %s)" % label for label in runs],
        data = sorted(runs + helpers + ["lib.sh"], key = _label_key),
        **kwargs
    )
