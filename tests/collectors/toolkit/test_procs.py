"""The process table (toolkit procs): the listening sockets of a process, from /proc/net and its fds."""

from __future__ import annotations

from pathlib import Path

from lockstep.collectors.toolkit.procs import ListeningSocket, Process, listening_sockets, process_table, socket_inodes

_TCP_HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def _tcp_line(local: str, inode: str) -> str:
    rest = f"00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 {inode} 1 0 100 0 0 10 0"
    return f"   0: {local} {rest}\n"


def test_a_socket_link_or_port_the_kernel_never_writes_loses_that_socket_only(tmp_path: Path) -> None:
    """Issue 29 item 15: a `socket:[abc]` fd link or a non-hex port in net/tcp raised out of
    process discovery and failed the inference collector every round."""
    pid_dir = tmp_path / "proc" / "4242"
    (pid_dir / "fd").mkdir(parents=True)
    (pid_dir / "net").mkdir()
    for fd, target in (("3", "socket:[123]"), ("4", "socket:[abc]"), ("5", "socket:[]"), ("6", "socket:[124]")):
        (pid_dir / "fd" / fd).symlink_to(target)  # dangling, as /proc's are to anything but a file
    (pid_dir / "net" / "tcp").write_text(
        _TCP_HEADER
        + _tcp_line("0100007F:1F90", "123")  # 127.0.0.1:8080
        + _tcp_line("0100007F:ZZZZ", "124")  # a port that is not hex
        + _tcp_line("XX00007F:1F91", "124")  # an address that is not hex
    )
    (pid_dir / "net" / "tcp6").write_text(_TCP_HEADER)
    assert socket_inodes(tmp_path / "proc", 4242) == {123, 124}
    assert listening_sockets(tmp_path / "proc", 4242) == [ListeningSocket("127.0.0.1", 8080, 123)]


def test_the_table_reads_each_processs_state_threads_and_whether_it_is_a_kernel_thread(tmp_path: Path) -> None:
    # Lines as this machine's kernel wrote them: kthreadd (flags 2129984 has PF_KTHREAD, 0x200000),
    # a 3-thread user process, and one whose command name holds ") D (".
    lines = {
        2: "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 1 0 0 20 0 1 0 30 0 0 18446744073709551615 0 0 0",
        300: "300 (python) R 1 300 300 0 -1 4194560 120 0 0 0 5 3 0 0 20 0 3 0 100 1000 10",
        77: "77 (evil ) D (x) S 1 77 77 0 -1 4194560 120 0 0 0 5 3 0 0 20 0 1 0 100 1000 10",
    }
    for pid, line in lines.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(line + "\n")
    assert process_table(tmp_path) == {
        2: Process(2, 0, "kthreadd", "S", 1, kernel_thread=True),
        300: Process(300, 1, "python", "R", 3),
        77: Process(77, 1, "evil ) D (x", "S", 1),
    }
