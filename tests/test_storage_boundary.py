"""The storage layer (src/io/storage.h) is the one way to reach the file
system: outside src/io, only the files named in docs/architecture.md
("Storage") may call the file system directly, each for a stated reason.
A new direct call elsewhere fails here, naming the file and line."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "src"

# Calls that reach the file system. Path arithmetic (fs::path, filename(),
# parent_path(), lexically_normal()) does not and is free to use.
FS_FUNCS = (
    "exists|is_directory|is_regular_file|is_symlink|is_empty|is_other|is_fifo|status|symlink_status|file_size|"
    "directory_iterator|recursive_directory_iterator|create_directory|create_directories|remove|remove_all|rename|"
    "copy|copy_file|copy_symlink|create_hard_link|create_symlink|create_directory_symlink|weakly_canonical|"
    "canonical|absolute|current_path|read_symlink|space|last_write_time|temp_directory_path|resize_file|permissions|"
    "hard_link_count|equivalent"
)
PATTERNS = [
    re.compile(r"\b(?:fs|std::filesystem)::(?:%s)\b" % FS_FUNCS),
    re.compile(r"(?<![\w>.])::(?:open|openat|stat|lstat|fstat|fstatat|unlink|unlinkat|rename|renameat|renameat2|mkdir|"
               r"mkdirat|rmdir|opendir|fdopendir|readdir|access|faccessat|readlink|realpath|link|linkat|symlink|"
               r"truncate|ftruncate|statfs|fstatfs|statvfs|copy_file_range|sendfile|chdir|getcwd)\s*\("),
    re.compile(r"\b(?:std::)?(?:fopen|ifstream|ofstream|fstream|opendir|readdir|realpath)\b"),
    re.compile(r"\bstd::(?:rename|remove|tmpfile)\s*\("),
    re.compile(r"\bH5F(?:open|create)\s*\("),  # libhdf5 opening a file by name
]

# The files outside src/io allowed to touch the file system, and why (the
# same list, with the same reasons, is in docs/architecture.md).
ALLOWED = {
    # libhdf5 opens files by name itself: the HDF5 format keeps local files.
    "formats/hdf5/hdf5_reader.cc": "libhdf5 reads a local file by name (in a child process)",
    "formats/hdf5/hdf5_writer.cc": "libhdf5 writes a local file by name",
    # Not checkpoint storage: finding the torch libraries this process loads.
    "exec/libtorch_locate.cc": "reads the installed torch wheel's version.py beside the library it loads",
    "exec/torch_plugin.cc": "checks that a plugin library is readable before dlopen loads it",
}


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"^\s*#\s*include[^\n]*", "", text, flags=re.M)
    return re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)  # string literals name paths, they do not open them


def direct_calls():
    found = {}
    for path in sorted(SRC.rglob("*")):
        if path.suffix not in (".cc", ".h", ".cu") or path.relative_to(SRC).parts[0] == "io":
            continue
        rel = path.relative_to(SRC).as_posix()
        for n, line in enumerate(strip_comments(path.read_text()).splitlines(), 1):
            if any(p.search(line) for p in PATTERNS):
                found.setdefault(rel, []).append(f"{rel}:{n}: {line.strip()}")
    return found


def test_only_the_named_files_outside_io_touch_the_file_system():
    found = direct_calls()
    stray = {f: lines for f, lines in found.items() if f not in ALLOWED}
    assert not stray, "direct file-system calls outside src/io (use io/storage.h):\n" + "\n".join(
        line for lines in stray.values() for line in lines)


def test_at_most_three_files_besides_hdf5_are_allowed():
    non_hdf5 = [f for f in ALLOWED if not f.startswith("formats/hdf5/")]
    assert len(non_hdf5) <= 3, non_hdf5


def test_the_allowed_list_is_documented_and_current():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    found = direct_calls()
    for f in ALLOWED:
        assert f"src/{f}" in doc, f"docs/architecture.md does not name src/{f} among the files that touch the disk"
    unused = [f for f in ALLOWED if f not in found and (SRC / f).exists()]
    assert not unused, f"allowed but no longer touching the file system (drop them): {unused}"


def test_the_checker_sees_a_direct_call():
    sample = 'std::error_code ec;\nif (fs::exists(p, ec)) {}\n::stat(p.c_str(), &st);\nZipReader::open(e);\n'
    lines = strip_comments(sample).splitlines()
    hits = [n for n, line in enumerate(lines, 1) if any(p.search(line) for p in PATTERNS)]
    assert hits == [2, 3]
