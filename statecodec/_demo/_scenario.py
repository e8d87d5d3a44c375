"""The deploy_production tool: what a real server does with ``requestState``.

Round 1 computes a deployment plan (the expensive, authoritative part) and asks two
independent questions in one round; the plan travels in ``requestState``. Round 2, which
may reach another instance, deploys exactly the plan it recovers. The handler writes and
reads plaintext: protecting that plaintext on the wire is the adapter's job, which is the
point of the scenario.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, Final, NamedTuple

import mcp_types as types
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from pydantic import BaseModel

ISSUER: Final = "https://idp.example"
CLIENT_ID: Final = "deploy-cli"
#: Bearer token -> user. A static verifier for the demo; production uses its OAuth verifier.
USERS: Final = {"alice-token": "alice", "bob-token": "bob"}
SERVER_NAME: Final = "deploy"
TOOL: Final = "deploy_production"
STAGING_TOOL: Final = "deploy_staging"  # the same flow, only on servers built for comparisons
TOOL_DESCRIPTION: Final = "Deploy a release to production"
TOOL_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {"version": {"type": "string", "description": "the release to deploy"}},
    "required": ["version"],
}
CONFIRM: Final = "confirm_deploy"
TICKET: Final = "change_ticket"

log = logging.getLogger("deploy")


def plan_for(version: str, instance: str) -> dict[str, Any]:
    """The expensive, authoritative part: what exactly will be rolled out."""
    return {
        "version": version,
        "plan_id": secrets.token_hex(4),
        "planned_on": instance,
        "steps": [f"canary {version} in eu-west-1", f"roll {version} to all regions", "verify health checks"],
    }


def _form(message: str, field: str, schema: dict[str, Any]) -> types.ElicitRequest:
    requested = {"type": "object", "properties": {field: schema}, "required": [field]}
    return types.ElicitRequest(
        params=types.ElicitRequestFormParams(message=message, requested_schema=requested)
    )


def ask(version: str, instance: str, plan: dict[str, Any] | None = None) -> types.InputRequiredResult:
    """Round 1: two independent questions, and the plan in requestState (plaintext here)."""
    plan = plan or plan_for(version, instance)
    log.info("round=1 instance=%s version=%s plan=%s", instance, version, plan["plan_id"])
    return types.InputRequiredResult(
        input_requests={
            CONFIRM: _form(
                f"Deploy {version} to production?", "confirm", {"type": "boolean", "title": "Confirm"}
            ),
            TICKET: _form(
                "Change ticket for the deployment", "ticket", {"type": "string", "title": "Ticket"}
            ),
        },
        request_state=json.dumps(plan),
    )


def _answer(responses: Any, key: str) -> tuple[str | None, dict[str, Any]]:
    response = (responses or {}).get(key)
    if isinstance(response, BaseModel):
        response = response.model_dump()
    if not isinstance(response, dict):
        return None, {}
    return response.get("action"), response.get("content") or {}


def finish(state: str, responses: Any, instance: str) -> dict[str, Any] | types.InputRequiredResult:
    """Round 2: deploy the plan recovered from the (verified) state."""
    plan = json.loads(state)
    confirm_action, confirm = _answer(responses, CONFIRM)
    ticket_action, ticket = _answer(responses, TICKET)
    if confirm_action is None or ticket_action is None:
        return ask(plan["version"], instance, plan)  # a state-only retry: ask again, same plan
    if confirm_action != "accept" or confirm.get("confirm") is not True or ticket_action != "accept":
        log.info("round=2 instance=%s plan=%s cancelled", instance, plan["plan_id"])
        return {
            "deployed": None,
            "plan_id": plan["plan_id"],
            "planned_on": plan["planned_on"],
            "deployed_on": instance,
        }
    log.info("round=2 instance=%s plan=%s deployed version=%s", instance, plan["plan_id"], plan["version"])
    return {
        "deployed": plan["version"],
        "plan_id": plan["plan_id"],
        "steps": plan["steps"],
        "ticket": str(ticket.get("ticket")),
        "planned_on": plan["planned_on"],
        "deployed_on": instance,
    }


def call_tool_result(outcome: dict[str, Any]) -> types.CallToolResult:
    text = (
        f"deployed {outcome['deployed']} (plan {outcome['plan_id']})" if outcome["deployed"] else "cancelled"
    )
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content=outcome
    )


def handle(
    version: str, state: str | None, responses: Any, instance: str
) -> types.CallToolResult | types.InputRequiredResult:
    """One call of the tool, whichever round it is."""
    if state is None:
        return ask(version, instance)
    outcome = finish(state, responses, instance)
    return outcome if isinstance(outcome, types.InputRequiredResult) else call_tool_result(outcome)


def user_answers(params: types.ElicitRequestParams) -> types.ElicitResult:
    """The user at the client: confirms the deployment and gives a change ticket."""
    properties = getattr(params, "requested_schema", {}).get("properties", {})
    if "confirm" in properties:
        return types.ElicitResult(action="accept", content={"confirm": True})
    return types.ElicitResult(action="accept", content={"ticket": "CHG-1234"})


class DeployServer(NamedTuple):
    """How to serve one built server: an ASGI app factory, or stdio for one client."""

    http_app: Callable[[], Any]
    run_stdio: Callable[[], Awaitable[None]]


class StaticVerifier:
    """Two fixed users (the SDK's ``TokenVerifier`` protocol)."""

    async def verify_token(self, token: str) -> AccessToken | None:
        user = USERS.get(token)
        if user is None:
            return None
        return AccessToken(token=token, client_id=CLIENT_ID, scopes=[], subject=user, claims={"iss": ISSUER})


def auth_settings() -> AuthSettings:
    return AuthSettings(issuer_url=ISSUER, resource_server_url=None)  # type: ignore[arg-type]
