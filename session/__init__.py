"""mcpool.session: per-session views, registry generations, routing and reconciliation."""

from ._flight import request_id
from ._interner import UNSHARED, Interner
from ._names import MAX_NAME, exposed_name, name_budget, seen_as, user_name_forms
from ._policy import PolicyKey, normalize_include
from ._reconcile import Action, ActionKind, Desired, Held, reconcile
from ._registry import (
    LIST_KINDS,
    CandidateRejected,
    RegistryGeneration,
    Route,
    build_candidate,
    empty_generation,
)
from ._requests import SERVER_CAPABILITIES
from ._session import Session, new_session_id
from ._view import Projection, SessionView, project

__all__ = [
    "LIST_KINDS",
    "MAX_NAME",
    "SERVER_CAPABILITIES",
    "UNSHARED",
    "Action",
    "ActionKind",
    "CandidateRejected",
    "Desired",
    "Held",
    "Interner",
    "PolicyKey",
    "Projection",
    "RegistryGeneration",
    "Route",
    "Session",
    "SessionView",
    "build_candidate",
    "empty_generation",
    "exposed_name",
    "name_budget",
    "new_session_id",
    "normalize_include",
    "project",
    "reconcile",
    "request_id",
    "seen_as",
    "user_name_forms",
]
