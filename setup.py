# All metadata lives in pyproject.toml; this file only adds one build step.
#
# The man pages (latencyd(8), latencyctl(8), latencyd.profile(5)) and the bash and zsh
# completions are generated from the code (latencyd/tools/manpages.py: the argparse parsers,
# the completions through shtab, every plugin's option schema, the shipped profiles:
# pyproject.toml's build-system requires shtab), not kept in the repository. Each
# build (`pip install .`, a wheel) writes them to build/share/, and data_files installs them
# from there to <prefix>/share/{man,bash-completion,zsh}, with the README the pages name.
# The build environment has neither latencyd nor its plugins installed, so the generator
# runs in a child Python on a copy of the packages laid out as installed (plugins/ is
# latencyd.plugins, where the plugins are found; profiles/ beside them, as in a checkout)
# next to the egg-info.
import glob
import os
import shutil
import subprocess
import sys
import tempfile

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from latencyd.tools.manpages import README, SHARE  # standard library only: fine to import here

GENERATED = "build/share"


def packages() -> list[str]:
    """latencyd's packages, found in the tree: latencyd/ and, as latencyd.plugins.*, plugins/
    and every package under it (a plugin that is a package is installed with no list to
    edit; pyproject.toml's package-dir maps latencyd.plugins to plugins/)."""
    here = os.path.dirname(os.path.abspath(__file__))
    return find_packages(here, include=["latencyd", "latencyd.*"]) + [
        f"latencyd.{name}" for name in find_packages(here, include=["plugins", "plugins.*"])
    ]


class BuildPyAndDocs(build_py):
    def run(self) -> None:
        super().run()
        self.run_command("egg_info")
        egg_info = self.get_finalized_command("egg_info").egg_info
        with tempfile.TemporaryDirectory() as stage:
            for package in self.packages:
                target = os.path.join(stage, *package.split("."))
                shutil.copytree(
                    self.get_package_dir(package),
                    target,
                    ignore=shutil.ignore_patterns("__pycache__"),
                    dirs_exist_ok=True,
                )
            shutil.copytree(egg_info, os.path.join(stage, os.path.basename(egg_info)))
            shutil.copytree("profiles", os.path.join(stage, "profiles"))
            outdir = os.path.abspath(GENERATED)
            command = [sys.executable, "-m", "latencyd.tools.manpages", outdir]
            # The Debian package's build: completion scripts made beforehand (debian/rules).
            if os.environ.get("LATENCYD_COMPLETIONS"):
                command += ["--completions-from", os.environ["LATENCYD_COMPLETIONS"]]
            # pip's isolated build environment reaches its packages (shtab) through
            # PYTHONPATH: keep them, the staged package first.
            path = os.pathsep.join(p for p in (stage, os.environ.get("PYTHONPATH")) if p)
            env = {**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"}
            done = subprocess.run(command, env=env, cwd=stage)  # cwd: not the source's latencyd/
        # An editable install (make setup) gets no data_files from setuptools anyway, and a
        # checkout has `latencyctl man` and `latencyctl completion`: only warn there.
        if done.returncode and not self.editable_mode:
            raise SystemExit(f"generating the man pages and completions failed ({done.returncode})")
        if done.returncode:
            print("warning: man pages and completions not generated", file=sys.stderr)


# Run as setuptools runs it (build_meta: __name__ "__main__"), not when a test imports it.
if __name__ == "__main__":
    setup(
        packages=packages(),
        cmdclass={"build_py": BuildPyAndDocs},
        data_files=[(os.path.dirname(f"share/{path}"), [f"{GENERATED}/{path}"]) for path in SHARE]
        + [(os.path.dirname(README), ["README.md"])]
        # Beside it, the pages its links lead to (docs/…), so they resolve where it is installed.
        + [(f"{os.path.dirname(README)}/docs", sorted(glob.glob("docs/*.md")))]
        # The shipped profiles, where latencyd.service.config.shipped_profiles_dir looks for them.
        + [("share/latencyd/profiles", sorted(glob.glob("profiles/*.toml")))],
    )
