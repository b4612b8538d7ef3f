"""@mpi: the machine's MPI headers and library, for the MPI plugin (runtime/mpi) only.

Looks for mpi.h through `mpicc --showme:incdirs` (Open MPI), `mpicc -show` (MPICH), then
$TDIST_MPI_HOME/include. Writes @mpi//:defs.bzl with MPI_FOUND, so a machine without MPI still
builds everything else (the plugin and its tests are then not defined: see runtime/mpi/BUILD).
"""

def _run(ctx, args):
    if not ctx.which(args[0]):
        return ""
    r = ctx.execute(args)
    return r.stdout.strip() if r.return_code == 0 else ""

def _impl(ctx):
    incdirs, libdirs, libs, kind = [], [], [], ""
    home = ctx.os.environ.get("TDIST_MPI_HOME", "")
    if home:
        incdirs = [home + "/include"]
        libdirs = [home + "/lib"]
        libs = ["mpi"]
        kind = "TDIST_MPI_HOME=" + home
    else:
        inc = _run(ctx, ["mpicc", "--showme:incdirs"])
        if inc:
            incdirs = inc.split(" ")
            libdirs = _run(ctx, ["mpicc", "--showme:libdirs"]).split(" ")
            libs = [w[2:] for w in _run(ctx, ["mpicc", "--showme:link"]).split(" ") if w.startswith("-l")]
            kind = "Open MPI (mpicc --showme)"
        else:
            show = _run(ctx, ["mpicc", "-show"])
            for w in show.split(" "):
                if w.startswith("-I"):
                    incdirs.append(w[2:])
                elif w.startswith("-L"):
                    libdirs.append(w[2:])
                elif w.startswith("-l"):
                    libs.append(w[2:])
            if incdirs:
                kind = "MPICH (mpicc -show)"
    found = False
    for d in incdirs:
        if d and ctx.path(d + "/mpi.h").exists:
            found = True
    if found:
        # The header directories, linked into the repository so Bazel sees them as sources.
        hdr_dirs = []
        for i, d in enumerate([d for d in incdirs if d]):
            ctx.symlink(d, "inc%d" % i)
            hdr_dirs.append("inc%d" % i)
        linkopts = ["-L" + d for d in libdirs if d] + ["-l" + l for l in libs]
        ctx.file("BUILD", """
cc_library(
    name = "mpi",
    hdrs = glob([{globs}]),
    includes = {includes},
    linkopts = {linkopts},
    visibility = ["//visibility:public"],
)
""".format(
            globs = ", ".join(['"%s/**/*.h"' % d for d in hdr_dirs]),
            includes = repr(hdr_dirs),
            linkopts = repr(linkopts),
        ))
    else:
        ctx.file("BUILD", "# No MPI found (mpicc, TDIST_MPI_HOME): nothing to build.\n")
    ctx.file("defs.bzl", "MPI_FOUND = %s\nMPI_KIND = %r\n" % (found, kind))

mpi_configure = repository_rule(
    implementation = _impl,
    environ = ["TDIST_MPI_HOME", "PATH"],
    local = True,
)
