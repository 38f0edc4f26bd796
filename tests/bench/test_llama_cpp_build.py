"""The llama.cpp peer's build: which variant becomes the peer (the first whose llama-bench runs a
prompt), each variant's own cache directory, and what a variant changes in the build (the AMX tile
config patch, the no-AMX flags). Downloads, cmake and the tools are stand-ins: a real build takes
minutes and is exercised by ``voxlane bench engine --peer llama.cpp``."""
from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from bench import llama_cpp_build as build

# ggml_tile_config_init's end as the 0.3.36 sdist's vendor/llama.cpp has it
MMQ_SNIPPET = """inline void ggml_tile_config_init(void) {
    static thread_local bool done = false;

    if (done) {
        return;
    }

    alignas(64) tile_config_t tc = {};
    tc.palette_id = 1;
    tc.rows[7] = 16;  tc.colsb[7] = 64;

    _tile_loadconfig(&tc);
    done = true;
}
"""
CRASHES_ON_PROMPTS = "#!/bin/sh\nif [ \"$4\" != 0 ]; then kill -SEGV $$; fi\necho ok\n"  # like the GCC 12 AMX build
RUNS = "#!/bin/sh\necho ok\n"


@pytest.fixture
def home(monkeypatch, tmp_path):
    monkeypatch.setattr(build.Path, "home", lambda: tmp_path)
    monkeypatch.setattr(build, "_chosen", {})
    return tmp_path


def install(bin_dir: Path, llama_bench: str) -> Path:
    """Stand-in tools in ``bin_dir``: llama-bench runs ``llama_bench``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in build.TOOLS:
        (bin_dir / tool).write_text(llama_bench if tool == "llama-bench" else RUNS)
        (bin_dir / tool).chmod(0o755)
    return bin_dir


def test_each_variant_has_its_own_cache_and_the_plain_build_keeps_its_key(home, monkeypatch):
    dirs = [build.cache_dir(v) for v in build.VARIANTS]
    assert len(set(dirs)) == len(build.VARIANTS)
    assert all(d.parent == home / ".cache" / "voxlane" / "llama.cpp" for d in dirs)
    assert build.VARIANTS[0].key_text() == ""  # the key builds made before the variants existed have
    monkeypatch.setattr(build, "cpu_flags", lambda: "another cpu")
    assert build.cache_dir(build.VARIANTS[1]) != dirs[1]


def test_a_build_that_crashes_on_prompts_is_passed_over_for_the_next_variant(home, monkeypatch, tmp_path):
    """The plain native build is cached and dies of SIGSEGV on ``-p 8`` (this AMX machine with GCC 12):
    the next variant is built and, since it runs the prompt, is the peer; asked again, nothing is
    built or smoke-run twice."""
    plain, fixed, _ = build.VARIANTS
    install(build.cache_dir(plain) / "bin", CRASHES_ON_PROMPTS)
    compiled = []

    def fake_compile(variant, log=None):
        compiled.append(variant.name)
        return install(build.cache_dir(variant) / "bin", RUNS)

    monkeypatch.setattr(build, "compile_variant", fake_compile)
    gguf = tmp_path / "model.gguf"
    log = io.StringIO()
    assert build.build_peer(log, smoke_gguf=gguf) == (build.cache_dir(fixed) / "bin", fixed)
    assert compiled == [fixed.name]
    assert "'native' fails its smoke run: llama-bench -p 8 -n 1 died of signal 11" in log.getvalue()
    smoked = []
    monkeypatch.setattr(build, "smoke", lambda bin_dir, gguf: smoked.append(bin_dir))
    assert build.build(smoke_gguf=gguf) == build.cache_dir(fixed) / "bin"
    assert compiled == [fixed.name] and smoked == []


def test_a_build_that_runs_prompts_is_kept_and_without_a_gguf_nothing_is_checked(home, monkeypatch, tmp_path):
    plain = build.VARIANTS[0]
    install(build.cache_dir(plain) / "bin", RUNS)
    monkeypatch.setattr(build, "compile_variant", lambda variant, log=None: pytest.fail("nothing to build"))
    assert build.build_peer(smoke_gguf=tmp_path / "model.gguf") == (build.cache_dir(plain) / "bin", plain)
    install(build.cache_dir(plain) / "bin", CRASHES_ON_PROMPTS)
    assert build.build_peer() == (build.cache_dir(plain) / "bin", plain)


def test_when_every_variant_crashes_the_error_says_why_for_each(home, monkeypatch, tmp_path):
    monkeypatch.setattr(build, "compile_variant",
                        lambda variant, log=None: install(build.cache_dir(variant) / "bin", CRASHES_ON_PROMPTS))
    with pytest.raises(RuntimeError, match="no llama.cpp build runs a prompt here") as error:
        build.build_peer(io.StringIO(), smoke_gguf=tmp_path / "model.gguf")
    assert str(error.value).count("died of signal 11") == len(build.VARIANTS)


def fake_toolchain(monkeypatch, tmp_path):
    """pip download writes an sdist holding mmq.cpp; cmake configure records the source it sees and its
    flags; cmake --build writes the tools. -> the list of recorded (mmq.cpp text, cmake command)."""
    seen = []

    def fake_run(cmd, log, **kwargs):
        if cmd[1:4] == ["-m", "pip", "download"]:
            sdist = Path(cmd[cmd.index("-d") + 1]) / f"llama_cpp_python-{build.VERSION}.tar.gz"
            data = MMQ_SNIPPET.encode()
            with tarfile.open(sdist, "w:gz") as archive:
                info = tarfile.TarInfo(f"llama_cpp_python-{build.VERSION}/vendor/llama.cpp/{build.TILECFG_PATCH.path}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
        elif cmd[:2] == ["cmake", "-S"]:
            seen.append(((Path(cmd[2]) / build.TILECFG_PATCH.path).read_text(), cmd))
        elif cmd[:2] == ["cmake", "--build"]:
            install(Path(cmd[2]) / "bin", RUNS)

    monkeypatch.setattr(build, "_run", fake_run)
    monkeypatch.setattr(build.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    return seen


def test_the_tile_config_variant_builds_patched_source(home, monkeypatch, tmp_path):
    """ldtilecfg reads the whole config (the struct itself is the asm's memory operand, so the compiler
    keeps the stores of rows and colsb); the plain variant builds the source as released."""
    seen = fake_toolchain(monkeypatch, tmp_path)
    plain, fixed, _ = build.VARIANTS
    assert build.compile_variant(fixed, io.StringIO()) == build.cache_dir(fixed) / "bin"
    assert build.compile_variant(plain, io.StringIO()) == build.cache_dir(plain) / "bin"
    (patched, _), (released, _) = seen
    assert '__asm__ volatile("ldtilecfg %0" :: "m"(tc));' in patched and "_tile_loadconfig(&tc)" not in patched
    assert "tc.colsb[7] = 64;" in patched and "done = true;" in patched  # the rest as it was
    assert released == MMQ_SNIPPET
    assert all((build.cache_dir(fixed) / "bin" / tool).exists() for tool in build.TOOLS)


def test_the_no_amx_variant_turns_amx_off_next_to_march_native(home, monkeypatch, tmp_path):
    seen = fake_toolchain(monkeypatch, tmp_path)
    no_amx = build.VARIANTS[2]
    build.compile_variant(no_amx, io.StringIO())
    ((source, cmake),) = seen
    assert source == MMQ_SNIPPET and "-DGGML_NATIVE=ON" in cmake
    for flag in ("-DCMAKE_C_FLAGS", "-DCMAKE_CXX_FLAGS"):
        (value,) = [arg.split("=", 1)[1] for arg in cmake if arg.startswith(flag + "=")]
        assert value.split() == ["-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"]


def test_a_patch_that_no_longer_matches_the_source_stops_the_build(tmp_path):
    file = tmp_path / build.TILECFG_PATCH.path
    file.parent.mkdir(parents=True)
    file.write_text(MMQ_SNIPPET.replace("_tile_loadconfig(&tc);", "load_tiles(&tc);"))
    with pytest.raises(RuntimeError, match="found 0"):
        build.TILECFG_PATCH.apply(tmp_path)
