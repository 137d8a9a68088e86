"""A throw-away Slurm cluster for tests, driven through scripts/slurm/local_cluster.sh.

The cluster's config reaches every Slurm command through `SLURM_CONF` in `LocalCluster.env`, never
through this process's environment, so other tests are untouched.
"""

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CLUSTER_SCRIPT = REPO_ROOT / "scripts" / "slurm" / "local_cluster.sh"
# Debian installs the daemons in /usr/sbin, which a non-login PATH may lack.
SLURM_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
REQUIRED_TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol")
# Starting takes ~5 s; generous for a loaded machine.
START_TIMEOUT_S = 120


def missing_requirements() -> str | None:
    """Why a local cluster cannot run here (one line), or None when it can."""
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool, path=SLURM_PATH) is None]
    if missing:
        return (
            f"Slurm is not installed (missing {', '.join(missing)}); "
            "install it with .ci/install_slurm.sh"
        )
    if os.geteuid() != 0:
        return "the local Slurm cluster's daemons must run as root"
    return None


@dataclass
class LocalCluster:
    folder: Path

    @property
    def env(self) -> dict[str, str]:
        """This process's environment, pointed at the cluster (jobs inherit it from sbatch)."""
        return {**os.environ, "PATH": SLURM_PATH, "SLURM_CONF": str(self.folder / "slurm.conf")}

    def run(
        self, args: list[str], timeout: float = 60, **env_overrides: str
    ) -> subprocess.CompletedProcess[str]:
        """Run a command (a Slurm client, usually) from the repository root; never raises on rc."""
        return subprocess.run(
            args,
            cwd=REPO_ROOT,
            env={**self.env, **env_overrides},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def daemon_pids(self) -> list[int]:
        """The PIDs the cluster script recorded for munged, slurmctld and each slurmd."""
        return [int(path.read_text()) for path in (self.folder / "run").glob("*.pid")]

    def jobs(self, name: str | None = None) -> list[str]:
        """Ids of the jobs (named NAME) the controller still knows: pending, running or just
        finished."""
        name_filter = [f"--name={name}"] if name else []
        result = self.run(["squeue", "--noheader", "--format=%i", *name_filter])
        return result.stdout.split()

    def job_fields(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, Restarts, TimeLimit, ...); empty once purged."""
        result = self.run(["scontrol", "--oneliner", "show", "job", job_id])
        if result.returncode != 0:
            return {}
        return dict(field.split("=", 1) for field in result.stdout.split() if "=" in field)


def find_processes(program: str, *words: str) -> list[int]:
    """PIDs of the processes running PROGRAM (the name of argv[0]) with all of WORDS among
    their arguments."""
    pids = []
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit():
            continue
        try:
            argv = (proc_dir / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue  # ended meanwhile
        if Path(argv[0]).name == program and all(word in argv for word in words):
            pids.append(int(proc_dir.name))
    return pids


def pending_signals(pid: int) -> set[int]:
    """Signals sent to PID but not yet delivered (a stopped process keeps them pending)."""
    pending = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("SigPnd:", "ShdPnd:")):
            pending |= int(line.split()[1], 16)
    return {signum for signum in range(1, 65) if pending & (1 << (signum - 1))}


def is_running(pid: int) -> bool:
    """True while PID is a live process; a zombie waiting to be reaped counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rpartition(")")[2].split()[0]  # "PID (COMM) STATE ..."
    return state != "Z"


@contextlib.contextmanager
def local_cluster(folder: Path) -> Iterator[LocalCluster]:
    """Bring a cluster up in FOLDER and take it down afterwards, also when the body fails."""
    cluster = LocalCluster(folder)
    try:
        started = subprocess.run(
            [str(CLUSTER_SCRIPT), "up", str(folder)],
            env=cluster.env,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
        )
        if started.returncode != 0:
            raise RuntimeError(f"local Slurm cluster did not start:\n{started.stderr}")
        yield cluster
    finally:
        subprocess.run(
            [str(CLUSTER_SCRIPT), "down", str(folder)],
            env=cluster.env,
            capture_output=True,
            timeout=START_TIMEOUT_S,
        )
