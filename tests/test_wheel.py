"""The wheel is the product: the README's Install commands, run as printed in a fresh venv, build
the wheel, install it, and `grpo-health serve` from outside the checkout serves the dashboard
from the wheel's own copy of the app and starts the demo run. Plus the fast checks behind it:
pyproject lists every package, serve finds the installed app and passes config.toml as flags."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tomllib
import urllib.request
from pathlib import Path

import pytest

from grpo_core.dashboard import access, processes, serve
from grpo_core.runs import locations
from grpo_core.runs.store import RunStore
from tests.helpers_dashboard import free_port, process_tree, wait_for

REPO = Path(__file__).resolve().parents[1]
STALL_S = 240  # ceilings only: each wait ends as soon as what it waits for happens


# ---- fast: what the wheel carries and how serve finds it ---------------------------------------------------
def test_pyproject_lists_every_package_of_grpo_core():
    listed = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    folders = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "grpo_core").rglob("__init__.py")}
    assert set(listed) == folders | {"grpo_core.streamlit_app", "grpo_core.streamlit_app.pages"}


def test_serve_passes_every_config_toml_setting_as_a_flag():
    """Streamlit's own command line (its click parser, as `streamlit run` reads the flags) takes
    serve's command to the file's settings, serve's address and port in place of the file's; an
    empty list has no flag (Streamlit reads it from the config.toml beside asgi.py)."""
    from streamlit.web import cli
    cfg = tomllib.loads((REPO / ".streamlit" / "config.toml").read_text())
    cmd = serve.streamlit_command(8765, host="0.0.0.0")
    assert cmd[cmd.index("run") + 1] == str(REPO / "asgi.py")
    parsed = cli.main_run.make_context("run", cmd[cmd.index("run") + 1:]).params
    for section, keys in cfg.items():
        for key, value in keys.items():
            if f"{section}.{key}" in ("server.address", "server.port"):
                continue
            got = parsed[f"{section}_{key}"]
            if isinstance(value, list):
                assert list(got or ()) == value, f"{section}.{key}"
            else:
                assert got == value, f"{section}.{key}"
    assert parsed["server_address"] == "0.0.0.0" and parsed["server_port"] == 8765
    assert cmd.count("--server.address") == 1


def test_without_a_checkout_serve_uses_the_installed_app_and_the_forms_lose_the_repo(monkeypatch, tmp_path):
    installed = tmp_path / "streamlit_app"
    monkeypatch.setattr(serve, "source_checkout", lambda: None)
    monkeypatch.setattr(serve, "INSTALLED_APP", installed)
    with pytest.raises(FileNotFoundError, match="dashboard entry point not found"):
        serve.app_dir()
    shutil.copytree(REPO / "pages", installed / "pages")
    shutil.copytree(REPO / ".streamlit", installed / ".streamlit")
    shutil.copy(REPO / "app.py", installed)
    with pytest.raises(FileNotFoundError, match="no asgi.py"):  # the pages without the server's entry point
        serve.app_dir()
    shutil.copy(REPO / "asgi.py", installed)
    assert serve.app_dir() == installed
    assert serve.streamlit_command(9)[4] == str(installed / "asgi.py")
    assert access.REPO == REPO  # this checkout: a form may read it
    monkeypatch.setattr(access, "REPO", None)  # an installed wheel: no repository to allow
    assert access.allowed_roots() == [locations.runs_dir()]


# ---- slow: the README's Install block, as printed ---------------------------------------------------------
def install_block() -> list[str]:
    """The command lines of the first ```bash block under README's '## Install'."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Install\n", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def fresh_venv(path: Path):
    """A venv whose dependencies are .venv's (a .pth), so pip finds them installed and downloads
    nothing; setuptools too (the venv's own, older one cannot build a wheel: it goes)."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=300)
    subprocess.run([path / "bin" / "python", "-m", "pip", "uninstall", "-q", "-y", "setuptools"], check=True,
                   timeout=300)
    site = next((path / "lib").glob("python3*/site-packages"))
    (site / "grpo_health_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")


def copy_checkout(dest: Path):
    """The checkout's files as git sees them (tracked and new), without build leftovers."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, listed):
        if (REPO / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, dest / rel)


def page_answers(port: int, proc: subprocess.Popen) -> bool:
    if proc.poll() is not None:
        pytest.fail(f"grpo-health serve exited with {proc.returncode}")
    health = urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)
    page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)
    return health.read() == b"ok" and page.status == 200 and b"<html" in page.read().lower()


def trained_steps(run: Path) -> int:
    with RunStore.open(run, readonly=True) as store:
        return store.last_step() or 0


def streamlit_app_path(serve_pid: int) -> str:
    """The script the Streamlit process under serve runs (its command line)."""
    for pid in process_tree(serve_pid)[1:]:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        if "streamlit" in argv:
            return argv[argv.index("run") + 1]
    raise AssertionError("no Streamlit process under serve")


@pytest.mark.slow
def test_the_readme_install_commands_build_install_and_serve_the_wheel(tmp_path, runs_dir):
    lines = install_block()
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert len(lines) == 4 and f"grpo_health-{version}-py3-none-any.whl" in lines[2], lines
    assert lines[-1].split("#")[0].strip().endswith("grpo-health serve")
    venv, home, checkout = tmp_path / "venv", tmp_path / "home", tmp_path / "checkout"
    home.mkdir()
    fresh_venv(venv)
    copy_checkout(checkout)
    port = free_port()
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "VIRTUAL_ENV": str(venv),
           "HOME": str(home), "GRPO_HEALTH_PORT": str(port),  # the venv activated; the free port
           "PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0"}  # pip's spelling of "off": build with .venv's
    env.pop("PYTHONPATH", None)
    for line in lines[:-1]:
        done = subprocess.run(["bash", "-c", line], cwd=checkout, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"

    site = next((venv / "lib").glob("python3*/site-packages"))
    where = subprocess.run([venv / "bin" / "python", "-c", "import grpo_core; print(grpo_core.__file__)"],
                           cwd=home, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where) == site / "grpo_core" / "__init__.py"  # the wheel's, not the checkout's
    assert (site / "grpo_core" / "streamlit_app" / "pages" / "live.py").is_file()
    settings = tomllib.loads((site / "grpo_core" / "streamlit_app" / ".streamlit" / "config.toml").read_text())
    assert settings["client"]["allowedOrigins"] == []  # beside asgi.py, where Streamlit reads what serve passes no flag for
    assets = site / "grpo_core" / "dashboard" / "assets"  # the live page's charts and refresh: their scripts, uPlot and its licence
    assert {p.name for p in assets.iterdir()} == {p.name for p in (REPO / "grpo_core" / "dashboard" / "assets").iterdir()}

    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen(["bash", "-c", lines[-1]], cwd=checkout, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    try:
        wait_for(lambda: page_answers(port, proc), STALL_S, what="the installed dashboard to answer")
        assert streamlit_app_path(proc.pid) == str(site / "grpo_core" / "streamlit_app" / "asgi.py")
        rid = wait_for(lambda: processes.live_demo(runs_dir), STALL_S, what="the demo run in the runs dir")
        wait_for(lambda: trained_steps(runs_dir / rid) >= 1, STALL_S, what="the demo trainer's first step")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/grpo-health/live/{rid}", timeout=30) as answer:
            assert json.loads(answer.read())["key"].endswith(".running")  # the live page's route, from the wheel
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as answer:
            assert f'data-run="{rid}"' in answer.read().decode()  # its HTML, with the run's first chart in it
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/host-config", timeout=30) as answer:
            assert json.loads(answer.read())["allowedOrigins"] == []  # no parent frame may steer the pages
        trainer = RunStore.open(runs_dir / rid, readonly=True)
        with trainer:
            pid = trainer.get_meta()["pid"]
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        assert Path(argv[0]).parent == venv / "bin" and Path(f"/proc/{pid}/cwd").resolve() == home  # the wheel's
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: serve stops its Streamlit and the demo it started
            try:
                proc.wait(timeout=STALL_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        rid = processes.live_demo(runs_dir)
        if rid:
            processes.stop_and_wait(rid, root=runs_dir, request_wait_s=10, signal_wait_s=20)
    assert "dashboard: http://127.0.0.1:" in (tmp_path / "serve.log").read_text()
