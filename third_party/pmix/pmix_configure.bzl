"""@pmix: OpenPMIx's headers and library (libpmix-dev), for tdist-agent's PMIx server only.

Found with `pkg-config pmix` (Debian 12: /usr/lib/x86_64-linux-gnu/pmix2), else $TDIST_PMIX_HOME.
Writes @pmix//:defs.bzl with PMIX_FOUND, so a machine without libpmix-dev still builds the agent
(operator-agent/pmix then builds the variant that says MPI jobs need a PMIx-enabled build).
"""

def _run(ctx, args):
    if not ctx.which(args[0]):
        return ""
    r = ctx.execute(args)
    return r.stdout.strip() if r.return_code == 0 else ""

def _impl(ctx):
    incdirs, linkopts = [], []
    home = ctx.os.environ.get("TDIST_PMIX_HOME", "")
    if home:
        incdirs = [home + "/include"]
        linkopts = ["-L" + home + "/lib", "-Wl,-rpath," + home + "/lib", "-lpmix"]
    else:
        cflags = _run(ctx, ["pkg-config", "--cflags", "pmix"])
        libs = _run(ctx, ["pkg-config", "--libs", "pmix"])
        incdirs = [w[2:] for w in cflags.split(" ") if w.startswith("-I")]
        linkopts = [w for w in libs.split(" ") if w]
    found = False
    for d in incdirs:
        if d and ctx.path(d + "/pmix_server.h").exists:
            found = True
            ctx.symlink(d, "inc")
    if found:
        ctx.file("BUILD", """
cc_library(
    name = "pmix",
    hdrs = glob(["inc/**/*.h"]),
    includes = ["inc"],
    linkopts = {linkopts},
    visibility = ["//visibility:public"],
)
""".format(linkopts = repr(linkopts)))
    else:
        ctx.file("BUILD", "# No OpenPMIx found (pkg-config pmix, TDIST_PMIX_HOME): nothing to build.\n")
    ctx.file("defs.bzl", "PMIX_FOUND = %s\n" % found)

pmix_configure = repository_rule(
    implementation = _impl,
    environ = ["TDIST_PMIX_HOME", "PATH", "PKG_CONFIG_PATH"],
    local = True,
)
