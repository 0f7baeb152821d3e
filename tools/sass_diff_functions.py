"""Compares the SASS of two CUDA binaries function by function, whatever
their order and whichever file each kernel came from: what a move of kernels
between translation units changes. Functions are keyed by (arch, demangled
name with "(anonymous namespace)::" removed), since an anonymous namespace's
mangled name carries its file's name; bodies are normalized as
tools/sass_diff.sh does (addresses, encodings), and section separators are
dropped. Needs cuobjdump and c++filt on PATH.
  python3 tools/sass_diff_functions.py OLD/libmlacore.so NEW/libmlacore.so
Exit 0: the same functions with identical bodies."""
import re
import subprocess
import sys

SKIP = re.compile(r"Fatbin|code for|arch =|Compiled from|host =|compile_size|identifier|^\s*\.\.\.")


def functions(path):
    text = subprocess.run(["cuobjdump", "-sass", path], capture_output=True, text=True, check=True).stdout
    found, arch, name, body = [], None, None, []

    def flush():
        if name is not None:
            found.append((arch, name, "\n".join(body)))

    for line in text.split("\n"):
        m = re.search(r"arch = (\S+)", line)
        if m:
            flush()
            arch, name, body = m.group(1), None, []
            continue
        m = re.search(r"Function : (\S+)", line)
        if m:
            flush()
            name, body = m.group(1), []
            continue
        if name is None or re.match(r"^\s*=*\s*$", line) or SKIP.search(line):
            continue
        line = re.sub(r"/\*[0-9a-f]{4}\*/", "", line)
        body.append(re.sub(r"/\* 0x[0-9a-f]+ \*/", "", line).rstrip())
    flush()
    names = sorted({n for _, n, _ in found})
    plain = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    readable = {n: d.replace("(anonymous namespace)::", "") for n, d in zip(names, plain.split("\n"))}
    out = {}
    for a, n, b in found:
        key = (a, readable[n])
        if key in out:
            sys.exit(f"{path}: two functions named {key}")
        out[key] = b
    return out


def main():
    old, new = functions(sys.argv[1]), functions(sys.argv[2])
    print(f"functions: {len(old)} / {len(new)}")
    only_old, only_new = sorted(set(old) - set(new)), sorted(set(new) - set(old))
    differ = sorted(k for k in set(old) & set(new) if old[k] != new[k])
    for k in only_old:
        print("only in the first:", k)
    for k in only_new:
        print("only in the second:", k)
    for k in differ:
        print("body differs:", k)
    if only_old or only_new or differ:
        print("SASS differs")
        return 1
    print("SASS identical, function by function")
    return 0


if __name__ == "__main__":
    sys.exit(main())
