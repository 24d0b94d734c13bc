"""A real single-node Slurm (Debian slurm-wlm + munge), started and stopped by the tests.

Everything lives in a temporary directory with its own munge socket and key and free
ports, so it never touches a Slurm or munge the machine may already run.  GPU GRES are
declared on device nodes made with mknod (/dev/nvidia0..3, char major 195) in an order
that differs from the device numbers, like the sites where existing tools mis-attribute.
"""

from __future__ import annotations

import os
import pwd
import random
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

# gres.conf's File= order: a job's GRES IDX is a position in this list, not a device number.
GRES_ORDER = (2, 0, 3, 1)
SECOND_USER = "lockstep-bob"
BINARIES = ("slurmctld", "slurmd", "munged", "sbatch", "scontrol", "squeue", "scancel", "sdiag")


def available() -> bool:
    return os.geteuid() == 0 and all(shutil.which(b) for b in BINARIES)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cgroup_v1_devices() -> bool:
    return (Path("/sys/fs/cgroup/devices") / "devices.list").exists()


@dataclass
class SlurmCluster:
    root: Path
    node: str
    env: dict[str, str]
    made_devices: list[Path]  # and the other files start() made outside root: stop() removes them
    processes: list[subprocess.Popen[bytes]]
    cgroup_v1: bool
    # The slurm_<node> cgroup directories there were before slurmd started: stop() removes the
    # ones it made (left behind, they made the node look like one with job cgroups and no jobs).
    cgroups_before: frozenset[Path] = frozenset()
    # Whether start() added SECOND_USER (stop() deletes it again, with its subordinate ids).
    made_user: bool = False

    def run(self, *args: str, user: str | None = None, check: bool = True) -> str:
        command = list(args) if user is None else ["runuser", "-u", user, "--", *args]
        result = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=60)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed: {result.stderr}")
        return result.stdout

    def sbatch(self, *args: str, user: str | None = None) -> str:
        out = self.run("sbatch", "--parsable", "--output=/dev/null", *args, "--wrap", "sleep 3600", user=user)
        return out.strip().split(";")[0]

    def wait_running(self, job_ids: list[str], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.run("squeue", "-h", "-t", "RUNNING", "-o", "%i %A")
            running = {word for line in out.splitlines() for word in line.split()}
            if all(j in running for j in job_ids):
                return
            time.sleep(0.2)
        raise AssertionError(f"jobs {job_ids} not running: {self.run('squeue')}")

    def _stepd_pids(self) -> list[int]:
        """This cluster's slurmstepd processes (they carry our SLURM_CONF in their environment)."""
        ours = f"SLURM_CONF={self.env['SLURM_CONF']}".encode()
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if (entry / "comm").read_text().strip() == "slurmstepd" and ours in (
                        entry / "environ"
                    ).read_bytes().split(b"\0"):
                        pids.append(int(entry.name))
                except OSError:
                    continue
        return pids

    def rpc_counts(self) -> dict[str, int]:
        """sdiag's RPC counts by message type."""
        counts: dict[str, int] = {}
        section = False
        for line in self.run("sdiag").splitlines():
            if line.startswith("Remote Procedure Call statistics by message type"):
                section = True
                continue
            if section:
                if not line.strip():
                    break
                name = line.split()[0]
                counts[name] = int(line.split("count:")[1].split()[0])
        return counts

    def stop(self) -> None:
        self.run("scancel", "--user", "root", check=False)
        self.run("scancel", "--user", SECOND_USER, check=False)
        # Let the jobs' slurmstepd finish before slurmd goes: orphaned ones wait for it forever.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.run("squeue", "-h", check=False).strip():
            time.sleep(0.2)
        self.run("scontrol", "shutdown", check=False)
        for proc in self.processes:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        for pid in self._stepd_pids():
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        subprocess.run(["munged", f"--socket={self.root / 'munge' / 'munge.sock'}", "--stop"], capture_output=True)
        for device in self.made_devices:
            device.unlink(missing_ok=True)
        for made in set(slurm_cgroups(self.node)) - self.cgroups_before:
            remove_cgroup(made)
        if self.made_user:
            subprocess.run(["userdel", SECOND_USER], capture_output=True, check=False)


def slurm_cgroups(node: str) -> list[Path]:
    return sorted(Path("/sys/fs/cgroup").glob(f"*/slurm_{node}")) + sorted(Path("/sys/fs/cgroup").glob("*/slurm"))


def remove_cgroup(top: Path) -> None:
    """rmdir a cgroup and its descendants, deepest first (their control files go with them)."""
    for dirpath, _, _ in sorted(os.walk(top, topdown=False), key=lambda entry: -entry[0].count("/")):
        try:
            os.rmdir(dirpath)
        except OSError:
            pass  # still has processes (a job that did not end): left as it is


def start(
    root: Path,
    slurm_user: str = "root",
    conf: dict[str, str] | None = None,
    controller_files: dict[str, Path] | None = None,
) -> SlurmCluster:
    """Start munged, slurmctld and slurmd with their files under ``root``.

    ``slurm_user``: slurm.conf's SlurmUser, the user slurmctld drops to and runs
    PrologSlurmctld and EpilogSlurmctld as (Debian's packaged configuration says ``slurm``);
    the state and log directories become its own.  ``conf``: slurm.conf parameters that replace
    or add to the defaults below (``{"EpilogSlurmctld": "/path", "MinJobAge": "300"}``).
    ``controller_files``: paths that slurmctld and the scripts it runs see replaced by these
    files or directories (``{"/etc/default": root / "etc-default"}``), bind-mounted in a mount
    namespace of its own: the host's stay as they are.  A path missing on the host is made
    (an empty file) for the mount to land on, and removed again by stop()."""
    node = socket.gethostname().split(".")[0]
    os.chmod(root, 0o755)  # munge and the jobs' users must reach the munge socket
    munge_dir = root / "munge"
    munge_dir.mkdir(mode=0o755)
    key = munge_dir / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    munge = pwd.getpwnam("munge")
    for path in (munge_dir, key):
        os.chown(path, munge.pw_uid, munge.pw_gid)
    sock = munge_dir / "munge.sock"
    subprocess.run(
        ["runuser", "-u", "munge", "--", "munged", f"--socket={sock}", f"--key-file={key}",
         f"--pid-file={munge_dir}/munged.pid", f"--log-file={munge_dir}/munged.log",
         f"--seed-file={munge_dir}/munged.seed"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip

    made = []
    for minor in range(4):
        device = Path(f"/dev/nvidia{minor}")
        if not device.exists():
            os.mknod(device, 0o666 | 0o020000, os.makedev(195, minor))
            made.append(device)
    for directory in ("state", "spool", "log"):
        (root / directory).mkdir()
    slurm = pwd.getpwnam(slurm_user)
    for directory in ("state", "log"):  # slurmctld writes them as SlurmUser
        os.chown(root / directory, slurm.pw_uid, slurm.pw_gid)
    cgroup_v1 = _cgroup_v1_devices()
    plugins = (
        {"ProctrackType": "proctrack/cgroup", "TaskPlugin": "task/cgroup"}
        if cgroup_v1
        else {"ProctrackType": "proctrack/linuxproc", "TaskPlugin": "task/none"}
    )
    parameters = {
        "ClusterName": "lockstep-test", "SlurmctldHost": node, "SlurmUser": slurm_user,
        "SlurmctldPort": str(_free_port()), "SlurmdPort": str(_free_port()),
        "AuthType": "auth/munge", "AuthInfo": f"socket={sock}", "CredType": "cred/munge",
        "StateSaveLocation": f"{root}/state", "SlurmdSpoolDir": f"{root}/spool",
        "SlurmctldPidFile": f"{root}/log/slurmctld.pid", "SlurmdPidFile": f"{root}/slurmd.pid",
        "SlurmctldLogFile": f"{root}/log/slurmctld.log", "SlurmdLogFile": f"{root}/log/slurmd.log",
        **plugins, "JobAcctGatherType": "jobacct_gather/none", "MpiDefault": "none",
        "SchedulerType": "sched/builtin", "SelectType": "select/cons_tres", "SelectTypeParameters": "CR_Core",
        "SlurmdParameters": "config_overrides", "ReturnToService": "2", "GresTypes": "gpu", "MinJobAge": "2",
        # Job ids of their own: job cgroups are per host, shared with any other Slurm here.
        "FirstJobId": str(random.randint(100_000, 900_000)),
        **(conf or {}),
    }  # fmt: skip
    (root / "slurm.conf").write_text(
        "".join(f"{key}={value}\n" for key, value in parameters.items())
        + f"NodeName={node} CPUs=8 RealMemory=4000 Gres=gpu:4 State=UNKNOWN\n"
        f"PartitionName=gpu Nodes={node} Default=YES MaxTime=INFINITE State=UP\n"
    )
    (root / "gres.conf").write_text(
        "".join(f"NodeName={node} Name=gpu File=/dev/nvidia{minor}\n" for minor in GRES_ORDER)
    )
    (root / "cgroup.conf").write_text(
        "CgroupPlugin=cgroup/v1\nConstrainDevices=yes\nConstrainCores=no\nConstrainRAMSpace=yes\n"
    )
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
    cgroups_before = frozenset(slurm_cgroups(node))
    made_user = False
    try:
        pwd.getpwnam(SECOND_USER)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", SECOND_USER], check=True)
        made_user = True
    controller = ["slurmctld", "-D", "-f", str(root / "slurm.conf")]
    if controller_files:
        binds: list[str] = []
        for target, source in controller_files.items():
            if not os.path.lexists(target):
                Path(target).touch(mode=0o644)
                made.append(Path(target))
            binds += [str(source), target]
        # unshare execs the shell, which mounts and execs slurmctld: the same process throughout.
        mount = 'while [ "$1" != -- ]; do mount --bind "$1" "$2" || exit 1; shift 2; done; shift; exec "$@"'
        controller = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", mount, "sh", *binds, "--",
                      *controller]  # fmt: skip
    processes = [
        subprocess.Popen(controller, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        subprocess.Popen(["slurmd", "-D", "-f", str(root / "slurm.conf")], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
    ]  # fmt: skip
    cluster = SlurmCluster(root, node, env, made, processes, cgroup_v1, cgroups_before, made_user)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        out = cluster.run("sinfo", "-h", "-o", "%T", check=False).strip()
        if out in ("idle", "mixed", "allocated"):
            return cluster
        time.sleep(0.3)
    log = (root / "log" / "slurmctld.log").read_text(errors="replace")[-2000:]
    cluster.stop()
    raise AssertionError(f"Slurm did not come up (sinfo: {out!r}); slurmctld log tail:\n{log}")


# Runs the agent as an unprivileged user.  The interpreter lives under /root here, where that
# user cannot reach it, so the process starts as root, imports everything, then drops to the
# user for good before the agent does anything.
AS_USER = """
import os, pwd, sys
import encodings.idna  # the HTTP server's getfqdn needs it
import lockstep.agent.cli, lockstep.agent.registry, lockstep.simulation.fake_nvml, lockstep.collectors.slurm, pynvml
lockstep.agent.cli.build_parser(lockstep.agent.registry.discover()).parse_args(sys.argv[2:])  # every lazy import, now
user = pwd.getpwnam(sys.argv[1])
os.setgroups([])
os.setgid(user.pw_gid)
os.setuid(user.pw_uid)
sys.exit(lockstep.agent.cli.main(sys.argv[2:]))
"""
