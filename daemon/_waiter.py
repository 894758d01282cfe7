"""The attached session's waiter: after the hand-off, `mcpool attach` becomes a tiny shell.

Once the daemon reads the client's stdin and writes its stdout itself, the bridge only waits for
the daemon's one `mcpool/ended` line on the control socket. A whole Python interpreter for that
costs ~5 MiB of private memory per session; `/bin/sh` (dash on Debian) running `WAITER_SCRIPT`
costs ~0.2 MiB. `exec_waiter` therefore replaces this process (same pid, so the client's child
and the daemon's peer stay the same) with the shell, the socket on fd 3. The contract is the
Python waiter's (`wait_handed_off`): exit 0 when the client closed, exit 1 with the reason on
stderr when the daemon ended the session, exit 1 with a line when the daemon went away,
SIGINT/SIGTERM exit 130/143; killing it closes the socket, and the daemon ends the session.
(A signal in the shell's first instant, before its traps are set, is the default death by that
signal: the session ends all the same.)

The script's first line replaces the process's own copies of the client's stdin and stdout by
/dev/null: the daemon holds the real ones, so the client sees end of file on stdout as soon as
the daemon closes its copy. stderr stays (the reason goes there). Done by the shell, not before
the exec, so an exec that fails leaves the bridge's stdio as it was without saving copies
(`fcntl` is import time of every client launch).

The script decodes only what the daemon sends (`notification("mcpool/ended", {"reason": ...,
"clientClosed": ...})`, compact JSON in that key order): the reason string's escapes `\\"`,
`\\\\`, `\\/`, `\\n` and `\\t` are undone; a `\\uXXXX` escape (the encoder emits one only for
control characters) is shown as written.

Stdlib only, like the rest of the bridge.
"""

import os

# The shell a waiter runs in; without it (or MCPOOL_ATTACH_WAITER=python) the Python one waits.
WAITER_SHELL = "/bin/sh"
WAITER_ENV = "MCPOOL_ATTACH_WAITER"
# The fd the script reads the control socket from (a redirection takes a single digit).
CONTROL_FD = 3
# What `ps` shows for a waiting session.
WAITER_NAME = "mcpool-attach-waiter"

WAITER_SCRIPT = r"""exec </dev/null >/dev/null
trap 'exit 130' INT
trap 'exit 143' TERM
while IFS= read -r line <&3; do
  case $line in
  *'"method":'*'"mcpool/ended"'*)
    case $line in *'"clientClosed":true'* | *'"clientClosed": true'*) exit 0 ;; esac
    reason='the daemon ended the session'
    case $line in
    *'"reason":'*)
      r=${line#*'"reason":'}
      r=${r# }
      out=
      case $r in
      '"'*)
        r=${r#?}
        while [ -n "$r" ]; do
          c=${r%"${r#?}"}
          r=${r#?}
          case $c in
          '"') break ;;
          '\')
            c=${r%"${r#?}"}
            r=${r#?}
            case $c in
            n) c='
' ;;
            t) c='	' ;;
            esac ;;
          esac
          out=$out$c
        done ;;
      esac
      [ -n "$out" ] && reason=$out ;;
    esac
    printf 'mcpool attach: %s\n' "$reason" >&2
    exit 1 ;;
  esac
done
printf 'mcpool attach: the daemon closed the connection\n' >&2
exit 1
"""


def waiter_available() -> bool:
    if os.environ.get(WAITER_ENV) == "python":
        return False
    return os.access(WAITER_SHELL, os.X_OK)


def exec_waiter(sock_fd: int) -> None:
    """Become the shell waiter on `sock_fd`. Returns only when that is not possible (no shell,
    or the exec failed), leaving stdin, stdout and `sock_fd` as they were."""
    if not waiter_available():
        return
    try:
        # The socket had a timeout (O_NONBLOCK): the shell's read would see EAGAIN as an end.
        os.set_blocking(sock_fd, True)
        if sock_fd != CONTROL_FD:
            os.dup2(sock_fd, CONTROL_FD)  # dup2 leaves the new fd inheritable
        else:
            os.set_inheritable(CONTROL_FD, True)
        os.execv(WAITER_SHELL, [WAITER_NAME, "-c", WAITER_SCRIPT, WAITER_NAME])
    except OSError:
        pass  # still here: the Python waiter waits instead, on the same stdio
