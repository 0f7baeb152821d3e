"""python -m mlacore: build flags for C++ consumers, and the benchmark (`bench`)."""

import argparse
import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        # The benchmarks are reached only here, so `import mlacore` never pays for them.
        from mlacore.bench import main as bench_main

        return bench_main(argv[1:])

    import mlacore

    parser = argparse.ArgumentParser(
        prog="python -m mlacore",
        description="Build flags for linking libmlacore, or `python -m mlacore bench [--mode ...]`.",
    )
    parser.add_argument("--version", action="store_true", help="print the mlacore version")
    parser.add_argument("--cflags", action="store_true", help="compiler flags (include path)")
    parser.add_argument("--libs", action="store_true", help="linker flags for libmlacore")
    parser.add_argument("--includedir", action="store_true", help="the include directory")
    parser.add_argument("--libdir", action="store_true", help="the directory holding libmlacore.so")
    parser.add_argument("--cmakedir", action="store_true", help="the directory holding mlacoreConfig.cmake")
    parser.add_argument("--pkgconfigdir", action="store_true", help="the directory holding mlacore.pc")
    args = parser.parse_args(argv)

    lib = mlacore.get_library_dir()
    out = []
    if args.version:
        out.append(mlacore.__version__)
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
