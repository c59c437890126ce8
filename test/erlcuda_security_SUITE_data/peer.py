#!/usr/bin/env python3
"""Helper of erlcuda_security_SUITE (SECURITY.md).

peer.py stranger NAME SECONDS
    Connects to the abstract AF_UNIX SEQPACKET socket NAME like gpud would,
    prints "connected", then waits up to SECONDS for a message and prints
    "result bytes=N fds=K" (bytes=0 fds=0: the VM closed the connection
    without handing anything over) or "result timeout".
peer.py seals PID
    For every erlcuda memfd that process PID holds or maps: "memfd WHERE SEALS
    GROW" where SEALS is F_GET_SEALS of the memfd (reopened through
    /proc/PID/fd/N or /proc/PID/map_files/RANGE, root only) and GROW
    the errno name of an ftruncate(size + 4096) (EPERM when sealed).
"""
import array
import errno
import fcntl
import os
import socket
import sys


def stranger(name, seconds):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect("\0" + name)
    print("connected", flush=True)
    s.settimeout(float(seconds))
    try:
        data, anc, _flags, _addr = s.recvmsg(4096, socket.CMSG_SPACE(64 * 4))
    except socket.timeout:
        print("result timeout", flush=True)
        return
    except ConnectionResetError:
        data, anc = b"", []
    fds = array.array("i")
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    for fd in fds:
        os.close(fd)
    print("result bytes=%d fds=%d" % (len(data), len(fds)), flush=True)


def memfds(pid):
    """Paths that reopen each erlcuda memfd of pid once: its fds, and its
    mappings (gpud closes a memfd's fd once it has mapped it)."""
    seen = set()
    for sub in ("fd", "map_files"):
        d = "/proc/%s/%s" % (pid, sub)
        for name in sorted(os.listdir(d)):
            path = os.path.join(d, name)
            try:
                if not os.readlink(path).startswith("/memfd:erlcuda"):
                    continue
                st = os.stat(path)
            except OSError:
                continue
            if st.st_ino not in seen:
                seen.add(st.st_ino)
                yield sub + "/" + name, path


def seals(pid):
    for what, path in memfds(pid):
        f = os.open(path, os.O_RDWR)
        try:
            s = fcntl.fcntl(f, fcntl.F_GET_SEALS)
            size = os.fstat(f).st_size
            try:
                os.ftruncate(f, size + 4096)
                grow = "grew"
            except OSError as e:
                grow = errno.errorcode.get(e.errno, str(e.errno))
        finally:
            os.close(f)
        print("memfd %s %d %s" % (what, s, grow), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "stranger":
        stranger(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "seals":
        seals(sys.argv[2])
    else:
        sys.exit("usage: peer.py stranger NAME SECONDS | seals PID")
