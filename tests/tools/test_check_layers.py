# SPDX-License-Identifier: MIT
"""tools/check_layers.py sees calls, not only includes: a file that uses
a symbol of a higher layer of csrc/, or two layers that use each other,
fail the check, both on nm output made up here and on objects compiled
here from a small tree laid out as setup.py lays out its build.  So do
the rules of the rooms: a cycle between the files of one folder, a
private header included from another folder, a simulator symbol used
outside sim/ and driver/, a source file over 1 500 lines, a file that
locks or gives up the GIL without a "Locks and the GIL" paragraph at the
top; each has a tree that breaks it and one that passes (the Python
import cycles: test_check_py_imports.py)."""

import importlib.util
import shutil
import subprocess
import sys

import pytest

from helpers import ROOT

SCRIPT = ROOT / "tools" / "check_layers.py"

pytestmark = pytest.mark.skipif(not SCRIPT.is_file(),
                                reason="tools/ is not in this checkout")


def load():
    spec = importlib.util.spec_from_file_location("check_layers", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_parse_nm_splits_defined_from_used():
    cl = load()
    text = ("cm_a T 0000000000000000 0000000000000010\n"
            "cm_b U\n"
            "cm_local t 0000000000000010 0000000000000004\n"
            "cm_data B 0000000000000000 0000000000000008\n")
    assert cl.parse_nm(text) == ({"cm_a", "cm_data"}, {"cm_b"})


def test_a_downward_use_passes():
    cl = load()
    objs = {"memory/memory.c": ({"cm_mem_alloc"}, {"cm_context_current"}),
            "context/context.c": ({"cm_context_current"}, set()),
            "array/types.c": (set(), {"cm_mem_alloc"})}
    bad, counts = cl.check_symbols(objs, allowed={})
    assert bad == []
    assert counts["memory", "context"] == 1
    assert counts["array", "memory"] == 1


def test_an_upward_use_fails_naming_file_symbol_and_layers():
    cl = load()
    objs = {"memory/memory.c": ({"cm_mem_alloc"}, {"cm_devicearray_new"}),
            "array/functions.c": ({"cm_devicearray_new"}, set())}
    bad, _ = cl.check_symbols(objs, allowed={})
    assert len(bad) == 1
    assert "memory/memory.c (memory) uses cm_devicearray_new" in bad[0]
    assert "higher layer array" in bad[0]


def test_two_layers_that_use_each_other_fail():
    cl = load()
    objs = {"memory/memory.c": ({"cm_mem_alloc"}, {"cm_devicearray_new"}),
            "array/functions.c": ({"cm_devicearray_new"}, {"cm_mem_alloc"})}
    bad, _ = cl.check_symbols(objs, allowed={})
    assert any("layers array and memory use each other" in b for b in bad)


def test_the_allow_list_names_an_accepted_upward_use(capsys):
    cl = load()
    objs = {"context/context.c": (set(), {"cm_mm_default"}),
            "memory/default.c": ({"cm_mm_default"}, set())}
    allowed = {("context/context.c", "cm_mm_default"): "a reason"}
    bad, _ = cl.check_symbols(objs, allowed=allowed)
    assert bad == []
    assert "allowed upward use: context/context.c" in capsys.readouterr().out


def test_the_tree_allows_no_upward_use():
    assert load().ALLOWED_UP == {}


def compile_tree(tmp_path, files):
    """Write files ({path under csrc/: C source}) and compile each into
    build/csrc/<path>.o, as setup.py's build-temp folder holds them (with
    csrc/ on the include path, as setup.py has it)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or shutil.which("nm") is None:
        pytest.skip("no C compiler or nm here")
    for rel, text in files.items():
        src = tmp_path / "csrc" / rel
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_text(text)
        obj = tmp_path / "build" / "csrc" / (rel[:-2] + ".o")
        obj.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([cc, "-c", "-I", str(tmp_path / "csrc"), "-o",
                        str(obj), str(src)], check=True)


def run(tmp_path, *extra):
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--csrc", str(tmp_path / "csrc"),
         "--build-temp", str(tmp_path / "build"), *extra],
        capture_output=True, text=True, timeout=120)


def test_compiled_objects_with_an_upward_call_fail(tmp_path):
    compile_tree(tmp_path, {
        "memory/mem.c": "int cm_up(void);\n"
                        "int cm_mem(void) { return cm_up(); }\n",
        "array/arr.c": "int cm_up(void) { return 1; }\n",
    })
    p = run(tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert ("memory/mem.c (memory) uses cm_up, defined in array/arr.c of "
            "the higher layer array") in p.stdout


def test_compiled_objects_with_downward_calls_pass(tmp_path):
    compile_tree(tmp_path, {
        "memory/mem.c": "int cm_mem(void) { return 1; }\n",
        "array/arr.c": "int cm_mem(void);\n"
                       "int cm_arr(void) { return cm_mem(); }\n",
    })
    p = run(tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "every use of another layer's symbol goes down" in p.stdout


def test_no_objects_is_a_clear_failure(tmp_path):
    (tmp_path / "csrc" / "memory").mkdir(parents=True)
    (tmp_path / "csrc" / "memory" / "mem.c").write_text("int x;\n")
    (tmp_path / "build").mkdir()
    p = run(tmp_path)
    assert p.returncode == 2
    assert "no compiled objects" in p.stdout
    assert "--build-temp" in p.stdout


# Cycles between the files of one folder.

def test_two_files_of_a_folder_that_use_each_other_fail():
    cl = load()
    objs = {"memory/limit.c": ({"cm_limit_take"}, {"cm_oom_note"}),
            "memory/interop.c": ({"cm_oom_note"}, {"cm_limit_take"}),
            "memory/pool.c": ({"cm_pool_put"}, {"cm_limit_take"})}
    bad = cl.check_cycles(objs)
    assert len(bad) == 1
    lines = bad[0].split("\n")
    assert lines[0] == "memory: cycle between files: interop.c, limit.c"
    assert "    interop.c -> limit.c (cm_limit_take)" in lines
    assert "    limit.c -> interop.c (cm_oom_note)" in lines
    assert not any("pool.c" in line for line in lines)


def test_a_subfolder_is_one_node_of_its_parent():
    cl = load()
    objs = {"memory/pool.c": ({"cm_pool_put"}, {"cm_arena_free"}),
            "memory/vmm/arena.c": ({"cm_arena_free"}, {"cm_share_x"}),
            "memory/vmm/share.c": ({"cm_share_x"}, {"cm_pool_put"})}
    bad = cl.check_cycles(objs)
    assert len(bad) == 1
    assert bad[0].startswith("memory: cycle between files: pool.c, vmm/")
    assert "    vmm/ -> pool.c (cm_pool_put)" in bad[0]
    # inside memory/vmm/ the two files do not use each other back
    nodes, edges = cl.folder_graphs(objs)["memory/vmm"]
    assert nodes == {"arena.c", "share.c"}
    assert set(edges) == {("arena.c", "share.c")}


def test_a_cycle_in_a_nested_folder_names_it():
    cl = load()
    objs = {"memory/vmm/a.c": ({"cm_a"}, {"cm_b"}),
            "memory/vmm/b.c": ({"cm_b"}, {"cm_a"})}
    bad = cl.check_cycles(objs)
    assert [b.split("\n")[0] for b in bad] == [
        "memory/vmm: cycle between files: a.c, b.c"]


def test_a_chain_of_files_has_no_cycle():
    cl = load()
    objs = {"memory/a.c": ({"cm_a"}, {"cm_b"}),
            "memory/b.c": ({"cm_b"}, {"cm_c"}),
            "memory/c.c": ({"cm_c"}, set()),
            "context/x.c": ({"cm_x"}, set())}
    assert cl.check_cycles(objs) == []


def test_many_symbols_of_an_edge_are_cut_short():
    cl = load()
    objs = {"sim/a.c": ({"sim_a"}, {"sim_b1", "sim_b2", "sim_b3",
                                    "sim_b4", "sim_b5"}),
            "sim/b.c": ({"sim_b1", "sim_b2", "sim_b3", "sim_b4",
                         "sim_b5"}, {"sim_a"})}
    bad = cl.check_cycles(objs)
    assert "a.c -> b.c (sim_b1, sim_b2, sim_b3, +2 more)" in bad[0]


def test_compiled_files_in_a_cycle_fail(tmp_path):
    compile_tree(tmp_path, {
        "memory/limit.c": "int cm_oom_note(void);\n"
                          "int cm_limit_take(void) "
                          "{ return cm_oom_note(); }\n",
        "memory/interop.c": "int cm_limit_take(void);\n"
                            "int cm_oom_note(void) "
                            "{ return cm_limit_take(); }\n",
    })
    p = run(tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "cycles between the files of one folder: 1" in p.stdout
    assert "memory: cycle between files: interop.c, limit.c" in p.stdout
    assert "    limit.c -> interop.c (cm_oom_note)" in p.stdout
    assert "    interop.c -> limit.c (cm_limit_take)" in p.stdout


def test_compiled_files_without_a_cycle_pass_and_graph(tmp_path):
    compile_tree(tmp_path, {
        "memory/limit.c": "int cm_limit_take(void) { return 1; }\n",
        "memory/interop.c": "int cm_limit_take(void);\n"
                            "int cm_oom_note(void) "
                            "{ return cm_limit_take(); }\n",
    })
    p = run(tmp_path, "--graph")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "no cycle between the files of a folder" in p.stdout
    assert "graph memory: 2 nodes, 1 edges" in p.stdout
    assert "    interop.c -> limit.c (1 symbol)" in p.stdout
    assert "graph csrc: 1 nodes, 0 edges" in p.stdout


# Private headers.

def write_tree(tmp_path, files):
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_private_header_from_another_folder_fails(tmp_path):
    cl = load()
    write_tree(tmp_path, {
        "csrc/memory/memory.h": "",
        "csrc/memory/pool.h": "",
        "csrc/memory/vmm/arena.h": "",
        "csrc/array/arr.c": '#include "memory/pool.h"\n',
        "csrc/memory/pool.c": '#include "memory/vmm/arena.h"\n',
    })
    bad = cl.check_private_headers(tmp_path / "csrc")
    assert bad == [
        "array/arr.c includes 'memory/pool.h', a header private to "
        "memory/ (its public header is memory/memory.h)",
        "memory/pool.c includes 'memory/vmm/arena.h', a header private "
        "to memory/vmm/ (it has no public header memory/vmm/vmm.h)"]


def test_public_shared_and_own_headers_pass(tmp_path):
    cl = load()
    write_tree(tmp_path, {
        "csrc/top.h": '#include "driver/cu_table.h"\n',
        "csrc/driver/cu_table.h": "",
        "csrc/driver/bytesize.h": "",
        "csrc/memory/memory.h": "",
        "csrc/memory/pool.h": "",
        "csrc/memory/vmm/vmm.h": "",
        "csrc/array/arr.c": '#include "memory/memory.h"\n'
                            '#include "memory/vmm/vmm.h"\n'
                            '#include "driver/bytesize.h"\n'
                            '#include "top.h"\n',
        "csrc/memory/vmm/arena.c": '#include "memory/pool.h"\n',
        "csrc/memory/pool.c": '#include "memory/pool.h"\n',
    })
    assert cl.check_private_headers(tmp_path / "csrc") == []


def test_the_shared_headers_exist():
    cl = load()
    for rel, why in cl.SHARED_HEADERS.items():
        assert (cl.ROOT / rel).is_file(), rel
        assert why


def test_compiled_tree_with_a_private_include_fails(tmp_path):
    write_tree(tmp_path, {"csrc/memory/pool.h": "int cm_pool(void);\n"})
    compile_tree(tmp_path, {
        "memory/pool.c": "int cm_pool(void) { return 1; }\n",
        "array/arr.c": '#include "memory/pool.h"\n'
                       "int cm_arr(void) { return cm_pool(); }\n",
    })
    p = run(tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert ("array/arr.c includes 'memory/pool.h', a header private to "
            "memory/") in p.stdout


# The simulator through the driver table only.

def test_a_sim_symbol_used_outside_sim_and_driver_fails():
    cl = load()
    objs = {"sim/stream.c": ({"cm_sim_launch_checked", "sim_Init"},
                             set()),
            "driver/driver.c": ({"cm_cu"}, {"sim_Init"}),
            "array/gather.c": (set(), {"cm_sim_launch_checked", "cm_cu"})}
    assert cl.check_sim_symbols(objs) == [
        "array/gather.c uses cm_sim_launch_checked, defined in "
        "sim/stream.c; the simulator is reached only through the driver "
        "table"]
    del objs["array/gather.c"]
    assert cl.check_sim_symbols(objs) == []


def test_compiled_tree_with_a_sim_call_from_array_fails(tmp_path):
    compile_tree(tmp_path, {
        "sim/stream.c": "int sim_launch(void) { return 1; }\n",
        "driver/driver.c": "int sim_launch(void);\n"
                           "int cm_drv(void) { return sim_launch(); }\n",
        "array/gather.c": "int sim_launch(void);\n"
                          "int cm_g(void) { return sim_launch(); }\n",
    })
    p = run(tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert ("array/gather.c uses sim_launch, defined in sim/stream.c; the "
            "simulator is reached only through the driver table"
            in p.stdout)
    assert "driver/driver.c uses" not in p.stdout


# Files over 1 500 lines.

def test_a_source_file_over_1500_lines_fails(tmp_path):
    cl = load()
    write_tree(tmp_path, {
        "tools/big.py": "x = 1\n" * 1501,
        "tools/edge.py": "x = 1\n" * 1500,
        "csrc/last.c": "int x;\n" * 1500 + "int y;",
        ".ci/run": "#!/bin/sh\n" + "true\n" * 1500,
        ".ci/data": "no script\n" * 2000,
        "docs/long.md": "text\n" * 2000,
        "build/gen.c": "int x;\n" * 2000,
        "venv1/pyvenv.cfg": "",
        "venv1/lib/site.py": "x = 1\n" * 2000,
        ".venv-gpu/lib/site.py": "x = 1\n" * 2000,
        ".old/memory.c": "int x;\n" * 2000,
    })
    assert sorted(cl.check_line_counts(tmp_path)) == [
        ".ci/run: 1501 lines, over 1500",
        "csrc/last.c: 1501 lines, over 1500",
        "tools/big.py: 1501 lines, over 1500"]


def test_a_git_checkout_counts_what_git_lists(tmp_path):
    cl = load()
    if shutil.which("git") is None:
        pytest.skip("no git here")
    write_tree(tmp_path, {
        ".gitignore": "ignored.py\n",
        "ignored.py": "x = 1\n" * 2000,
        "tracked.py": "x = 1\n" * 1600,
        "build/gen.py": "x = 1\n" * 2000,
        "small.py": "x = 1\n",
    })
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "tracked.py",
                    "build/gen.py"], check=True)
    found = sorted(p.relative_to(tmp_path).as_posix()
                   for p in cl.source_files(tmp_path))
    assert found == ["build/gen.py", "small.py", "tracked.py"]
    assert sorted(cl.check_line_counts(tmp_path)) == [
        "build/gen.py: 2000 lines, over 1500",
        "tracked.py: 1600 lines, over 1500"]


def test_compiled_tree_with_a_long_file_fails(tmp_path):
    compile_tree(tmp_path, {
        "memory/mem.c": "int cm_mem(void) { return 1; }\n"
                        + "/* */\n" * 1500,
    })
    p = run(tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "files over 1500 lines: 1" in p.stdout
    assert "csrc/memory/mem.c: 1501 lines, over 1500" in p.stdout


# Locks and the GIL said at the top.

HEAD = ("/* SPDX-License-Identifier: MIT */\n"
        "/*\n"
        " * pool.c: the pool.\n"
        "%s"
        " */\n")
LOCKS = (" *\n"
         " * Locks and the GIL: takes the pool's mutex (cm_mu_lock), never\n"
         " * across a driver call.\n")
LOCKING_BODY = ("void cm_mu_lock(void *m);\n"
                "void cm_pool_put(void *m) { cm_mu_lock(m); }\n")


def test_a_file_that_locks_without_the_paragraph_fails(tmp_path):
    cl = load()
    write_tree(tmp_path, {
        "csrc/memory/pool.c": HEAD % "" + LOCKING_BODY,
        "csrc/memory/ok.c": HEAD % LOCKS + LOCKING_BODY,
        "csrc/memory/late.c": HEAD % "" + "/*\n" + LOCKS + " */\n"
                              + LOCKING_BODY,
        "csrc/memory/plain.c": HEAD % "" + "int cm_x(void) { return 1; }\n",
    })
    bad = cl.check_lock_comments(tmp_path / "csrc")
    assert bad == [
        "memory/late.c: takes a lock or gives up the GIL (cm_mu_lock line "
        "10) and its head comment has no paragraph beginning "
        "' * Locks and the GIL:'",
        "memory/pool.c: takes a lock or gives up the GIL (cm_mu_lock line "
        "5) and its head comment has no paragraph beginning "
        "' * Locks and the GIL:'"]


def test_a_primitive_named_in_a_comment_or_string_is_no_use():
    cl = load()
    text = ("/* cm_mu_lock here */\n"
            "// CM_CU_NOGIL there\n"
            'const char *s = "Py_BEGIN_ALLOW_THREADS \\" sim_lock";\n'
            "int cm_mu_lockless;\n"
            "CM_DRIVER_BEGIN_NOGIL\n")
    assert cl.lock_uses(text) == {"CM_DRIVER_BEGIN_NOGIL": 5}


def test_the_head_comment_is_the_first_block_after_spdx():
    cl = load()
    assert cl.head_comment(HEAD % LOCKS + "/* later */\n").startswith(
        "/*\n * pool.c")
    assert cl.head_comment("/* SPDX-License-Identifier: MIT */\n"
                           "int x;\n/* late */\n") is None


# A file that defines a primitive counts too when it locks.
LOCK_DEFINED = ("#include <pthread.h>\n"
                "void cm_mu_lock(pthread_mutex_t *m)\n"
                "{ pthread_mutex_lock(m); }\n")


def test_compiled_tree_that_locks_without_saying_so_fails(tmp_path):
    compile_tree(tmp_path, {
        "memory/pool.c": HEAD % "" + LOCKING_BODY,
        "memory/lock.c": HEAD % "" + LOCK_DEFINED,
    })
    p = run(tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert ("memory/pool.c: takes a lock or gives up the GIL (cm_mu_lock "
            "line 5)") in p.stdout
    assert ("memory/lock.c: takes a lock or gives up the GIL (cm_mu_lock "
            "line 6, pthread_mutex_lock line 7)") in p.stdout


def test_compiled_tree_that_says_its_locks_passes(tmp_path):
    compile_tree(tmp_path, {
        "memory/pool.c": HEAD % LOCKS + LOCKING_BODY,
        "memory/lock.c": HEAD % LOCKS + LOCK_DEFINED,
    })
    p = run(tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert ("every file that locks or gives up the GIL says so at the top"
            in p.stdout)
