"""python -m mlacore: build flags for C++ consumers, and the benchmark (`bench`)."""

import argparse
import sys


def _parser(version: str) -> argparse.ArgumentParser:
    # The bench's options live with the bench (mlacore.bench imports no torch
    # until a run starts), so `bench --help` lists them.
    from mlacore import bench

    parser = argparse.ArgumentParser(
        prog="python -m mlacore",
        description="Build flags for linking libmlacore from C++, or the benchmark (`bench`).",
    )
    parser.add_argument("--version", action="version", version=version, help="print the mlacore version and exit")
    parser.add_argument("--cflags", action="store_true", help="compiler flags (include path)")
    parser.add_argument("--libs", action="store_true", help="linker flags for libmlacore")
    parser.add_argument("--includedir", action="store_true", help="the include directory")
    parser.add_argument("--libdir", action="store_true", help="the directory holding libmlacore.so.0")
    parser.add_argument("--cmakedir", action="store_true", help="the directory holding mlacoreConfig.cmake")
    parser.add_argument("--pkgconfigdir", action="store_true", help="the directory holding mlacore.pc")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    bench_parser = commands.add_parser("bench", help="run the benchmarks: " + bench.SUMMARY,
                                       description=bench.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_arguments(bench_parser)
    return parser


def main(argv=None) -> int:
    import mlacore

    parser = _parser(mlacore.__version__)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "bench":
        from mlacore.bench import run

        return run(args)

    lib = mlacore.get_library_dir()
    out = []
    if args.cflags:
        out.append(f"-I{mlacore.get_include()}")
    if args.libs:
        out.append(f"-L{lib} -Wl,-rpath,{lib} -lmlacore")
    if args.includedir:
        out.append(mlacore.get_include())
    if args.libdir:
        out.append(lib)
    if args.cmakedir:
        out.append(mlacore.get_cmake_dir())
    if args.pkgconfigdir:
        out.append(mlacore.get_pkgconfig_dir())
    if not out:
        parser.print_help()
        return 0
    print(" ".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
