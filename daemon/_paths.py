"""Where mcpool keeps its socket, configuration and state, and whether the socket is ours.

Stdlib only: the attach bridge imports this on every client launch. XDG variables are honoured
only when set to an absolute path, as the XDG Base Directory spec requires; an empty or relative
value means "unset".

Trust (X1, X3). The socket's folder is used only when it is ours: a real folder (not a symlink),
owned by our uid, with no access for group or others (0700). The daemon creates it 0700 when
it is missing (the last component only: its parent, such as /tmp, may be shared); the socket
file must be ours too; and a client checks the uid of the process it reached (SO_PEERCRED)
before it sends a byte, so a bridge never hands its stdin and stdout to another user's process.
A folder that fails is an error naming it, its owner and its mode, never a reason to try
another path.
"""

import _socket
import os
import stat
import sys

# Not `pathlib` at import: it (with fnmatch, ntpath and urllib.parse) is start-up time of every
# client launch. The bridge uses the `*_str` forms; the Path-returning ones import it when called
# (their annotations are quoted: no `from __future__ import annotations`, which imports a module).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

# Where the login manager (systemd-logind, elogind) puts each user's runtime folder. Looked at
# when XDG_RUNTIME_DIR is unset, since several MCP clients drop it from a server's environment.
RUN_USER_BASE = "/run/user"
# Tests only: a stand-in for RUN_USER_BASE (creating /run/user/<uid> would touch the machine).
RUN_USER_BASE_ENV = "MCPOOL_TEST_RUN_USER_BASE"


def _path(value: str) -> "Path":
    from pathlib import Path

    return Path(value)


def _root(path: str) -> str:
    """The root `PurePosixPath` keeps: "/", "//" (exactly two, as POSIX allows), or none."""
    if path.startswith("//") and not path.startswith("///"):
        return "//"
    return "/" if path.startswith("/") else ""


def _join(*parts: str) -> str:
    """`str(PurePosixPath(*parts))`: joined, empty and "." components dropped, and a later
    absolute part restarting the path."""
    root = ""
    components: list[str] = []
    for part in parts:
        if part.startswith("/"):
            root, components = _root(part), []
        components.extend(c for c in part.split("/") if c and c != ".")
    return root + "/".join(components) or "."


def _home() -> str:
    return os.path.expanduser("~")  # what Path.home() returns


def _explicit(value: str) -> str:
    # The daemon does not share the caller's working directory (it is started in "/"), so a
    # relative --socket or $MCPOOL_SOCKET must be pinned down here, where it was meant.
    return _join(os.path.abspath(os.path.expanduser(value)))


def _xdg(name: str) -> str | None:
    value = os.environ.get(name, "")
    return _join(value) if os.path.isabs(value) else None


def socket_path(cli: str | None = None) -> "Path":
    return _path(socket_path_str(cli))


def socket_path_str(cli: str | None = None) -> str:
    if cli:
        return _explicit(cli)
    if env := os.environ.get("MCPOOL_SOCKET"):
        return _explicit(env)
    if configured := _configured_socket():
        return _explicit(configured)
    return default_socket_path_str()


def default_socket_path(
    run_user_base: str | None = None, *, use_environment: bool = True
) -> "Path":
    return _path(default_socket_path_str(run_user_base, use_environment=use_environment))


def default_socket_path_str(
    run_user_base: str | None = None, *, use_environment: bool = True
) -> str:
    """The socket without an explicit choice: `$XDG_RUNTIME_DIR/mcpool`, else
    `/run/user/<uid>/mcpool` when that runtime folder exists and is ours, else
    `/tmp/mcpool-<uid>`. `use_environment=False` leaves XDG_RUNTIME_DIR out: what a client that
    drops it from a server's environment finds."""
    if use_environment and (runtime := _xdg("XDG_RUNTIME_DIR")):
        return _join(runtime, "mcpool", "daemon.sock")
    uid = os.geteuid()
    base = run_user_base or os.environ.get(RUN_USER_BASE_ENV) or RUN_USER_BASE
    run_user = _join(base, str(uid))
    try:
        st = os.lstat(run_user)
    except OSError:
        st = None
    if st is not None and _problem(run_user, st, uid) is None:
        return _join(run_user, "mcpool", "daemon.sock")
    return _join(f"/tmp/mcpool-{uid}", "daemon.sock")


def client_socket_path() -> "Path":
    """The socket a bridge finds when its client passes it none of the variables above: Codex
    and the SDK's default environment keep little more than HOME and PATH."""
    configured = _configured_socket(_join(_home(), ".config", "mcpool", "config.json"))
    if configured:
        return _path(_explicit(configured))
    return default_socket_path(use_environment=False)


def _configured_socket(path: "Path | str | None" = None) -> str | None:
    """`"daemon": {"socket": PATH}` in the user config, read with the stdlib (bridge start-up)."""
    try:
        with open(path or config_path_str(None), "rb") as f:
            from mcpool.daemon import _jsonlite  # not `json`: bridge start-up (_attach.py)

            doc = _jsonlite.loads(f.read() or b"{}")
    except (OSError, ValueError):
        return None
    daemon = doc.get("daemon") if isinstance(doc, dict) else None
    value = daemon.get("socket") if isinstance(daemon, dict) else None
    return value if isinstance(value, str) and value else None


def config_path(cli: str | None = None) -> "Path":
    return _path(config_path_str(cli))


def config_path_str(cli: str | None = None) -> str:
    if cli:
        return _explicit(cli)
    if env := os.environ.get("MCPOOL_CONFIG"):
        return _explicit(env)
    if config_home := _xdg("XDG_CONFIG_HOME"):
        return _join(config_home, "mcpool", "config.json")
    return _join(_home(), ".config", "mcpool", "config.json")


def state_dir() -> "Path":
    return _path(state_dir_str())


def state_dir_str() -> str:
    if state_home := _xdg("XDG_STATE_HOME"):
        return _join(state_home, "mcpool")
    return _join(_home(), ".local", "state", "mcpool")


def snapshots_dir() -> "Path":
    """Where discovery snapshots are kept across daemon restarts (a cache: losing it is safe)."""
    if cache_home := _xdg("XDG_CACHE_HOME"):
        return _path(_join(cache_home, "mcpool", "snapshots"))
    return _path(_join(_home(), ".cache", "mcpool", "snapshots"))


def lock_path(sock: "Path") -> "Path":
    return sock.with_name(sock.name + ".lock")


def daemon_log_path(sock: "Path | str") -> "Path":
    """The daemon's own log. One per user for now; `sock` is taken so that a per-socket log can
    come later without changing callers."""
    return _path(daemon_log_path_str(sock))


def daemon_log_path_str(sock: "Path | str") -> str:
    return _join(state_dir_str(), "daemon.log")


# -- trust ----------------------------------------------------------------------------------------

FIX = "or choose another socket with --socket or MCPOOL_SOCKET"

# A Unix socket's address holds its path in `sun_path`: 108 bytes on Linux, 104 on macOS and the
# BSDs, the last of them the terminating NUL. A longer path cannot be bound or connected to.
SUN_PATH_SIZE = 108 if sys.platform.startswith("linux") else 104
MAX_SOCKET_PATH = SUN_PATH_SIZE - 1


class UnsafeSocketPath(Exception):
    """A socket path mcpool will not use: its folder, file or listener is not ours (the message
    names the path, its owner and mode), or it is too long; the message says what to do."""


class SocketPathTooLong(UnsafeSocketPath):
    """The path does not fit in a Unix socket address (MAX_SOCKET_PATH)."""


def check_socket_path_length(sock: "Path | str") -> None:
    """Before anything binds or connects: the path fits in `sun_path`, else one line naming the
    limit and the path (the socket module's own "AF_UNIX path too long" names neither)."""
    size = len(os.fsencode(sock))
    if size > MAX_SOCKET_PATH:
        raise SocketPathTooLong(
            f"the socket path {sock} is {size} bytes long; a Unix socket path may be at most "
            f"{MAX_SOCKET_PATH} bytes here ({SUN_PATH_SIZE} with its final NUL): choose a "
            "shorter one with --socket or MCPOOL_SOCKET"
        )


def check_socket_dir(folder: "Path | str") -> bool:
    """Whether `folder` exists (False: it does not); raises UnsafeSocketPath unless it is a real
    folder owned by us with mode 0700. One `lstat`: it never follows a symlink, and it is all
    the bridge's start pays. Only the last component is checked: the parent is either ours
    ($XDG_RUNTIME_DIR) or sticky (/tmp), where nobody else can rename our folder away."""
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise UnsafeSocketPath(
            f"cannot inspect the socket folder {folder}: {exc.strerror}"
        ) from None
    problem = _problem(folder, st, os.geteuid())
    if problem is not None:
        raise UnsafeSocketPath(problem)
    return True


def prepare_socket_dir(sock: "Path") -> None:
    """The daemon's side: create the socket's folder 0700 when it is missing, then check it.

    `mkdir` makes the last component only and never follows a symlink there (an existing link
    is EEXIST, and the check then names it); a missing parent is an error, not something to
    create in a place we may not own."""
    check_socket_path_length(sock)
    folder = sock.parent
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        raise UnsafeSocketPath(
            f"cannot create the socket folder {folder}: its parent {folder.parent} does not "
            f"exist; create it, {FIX}"
        ) from None
    except OSError as exc:
        raise UnsafeSocketPath(
            f"cannot create the socket folder {folder}: {exc.strerror}"
        ) from None
    else:
        # A umask may have taken the owner's bits; the folder is ours, so set them exactly.
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            if stat.S_IMODE(os.fstat(fd).st_mode) != 0o700:
                os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
    check_socket_dir(folder)


def check_socket_path(sock: "Path | str") -> None:
    """A client's side, before it connects: the folder is ours (or missing, and the daemon will
    create it) and so is the socket file when there is one, and its path fits a socket address."""
    check_socket_path_length(sock)
    if not check_socket_dir(_parent(sock)):
        return
    try:
        st = os.lstat(sock)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UnsafeSocketPath(f"cannot inspect the socket {sock}: {exc.strerror}") from None
    uid = os.geteuid()
    if st.st_uid != uid:
        raise UnsafeSocketPath(
            f"the socket {sock} is owned by {_user(st.st_uid)}, not by you ({_user(uid)}), mode "
            f"{_mode(st)}: it is not your mcpool daemon's. Remove it (rm {sock}), {FIX}"
        )


def _parent(path: "Path | str") -> str:
    """`str(Path(path).parent)`."""
    whole = _join(os.fspath(path))
    root = _root(whole)
    rest = whole[len(root) :]
    if "/" in rest:
        return root + rest.rsplit("/", 1)[0]
    return root or "."


def check_daemon_peer(sock: _socket.socket, path: "Path | str") -> None:
    """Right after connect, before anything is sent: the listening process runs as our uid."""
    creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    pid = int.from_bytes(creds[0:4], sys.byteorder, signed=True)
    peer_uid = int.from_bytes(creds[4:8], sys.byteorder, signed=True)
    uid = os.geteuid()
    if peer_uid != uid:
        raise UnsafeSocketPath(
            f"the process listening on {path} (pid {pid}) runs as {_user(peer_uid)}, not as you "
            f"({_user(uid)}): refusing to talk to it. Find out who put it there, {FIX}"
        )


def _problem(folder: "Path | str", st: os.stat_result, uid: int) -> str | None:
    """What makes `folder` (its `lstat`) unfit to hold our socket, or None."""
    if stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not stat.S_IMODE(st.st_mode) & 0o077:
        return None  # the common case, without a user-database lookup
    mode = _mode(st)
    owner = _user(st.st_uid)
    if stat.S_ISLNK(st.st_mode):
        try:
            target = f" to {os.readlink(folder)}"
        except OSError:
            target = ""
        return (
            f"the socket folder {folder} is a symbolic link{target} (owner {owner}, mode {mode}); "
            "mcpool uses only a real folder that you own with mode 0700, since a link may lead "
            f"into another user's folder. Remove the link (rm {folder}) and the daemon creates "
            f"the folder, {FIX}"
        )
    if not stat.S_ISDIR(st.st_mode):
        return (
            f"the socket folder {folder} is not a folder (owner {owner}, mode {mode}). Remove it "
            f"and the daemon creates the folder, {FIX}"
        )
    if st.st_uid != uid:
        return (
            f"the socket folder {folder} is owned by {owner}, not by you ({_user(uid)}), mode "
            f"{mode}: another user could pose as your mcpool daemon there. Have it removed (by "
            f"its owner or root) and the daemon creates it, {FIX}"
        )
    return (
        f"the socket folder {folder} (owner {owner}) has mode {mode}; mcpool needs 0700, so "
        f"that no other user can replace the socket. Run `chmod 700 {folder}`, {FIX}"
    )


def _mode(st: os.stat_result) -> str:
    return f"{stat.S_IMODE(st.st_mode):04o}"


def _user(uid: int) -> str:
    import pwd  # error messages only

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
