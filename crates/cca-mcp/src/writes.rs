//! The tools that change the cluster, offered only when the server was
//! started with writes allowed (`cca mcp --allow-writes`). Each is two
//! calls: without `confirm` it only plans — it asks the API what would
//! change and answers the plan with a confirmation token; called again
//! with the same arguments and that token it plans again and acts only if
//! the plan is still the one the token was given for. The token is a MAC
//! of the tool, its arguments and the plan (and, over HTTP, the caller's
//! bearer token) under a key of this server, so an assistant cannot make
//! one up, reuse it for other arguments or another caller, or act on a
//! plan the cluster has moved past.

use aws_lc_rs::hmac;
use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use rmcp::ErrorData;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::server::{CcaMcp, api_error, compile};

/// Signs plans for one session.
pub(crate) struct Confirmer {
    key: hmac::Key,
}

impl Confirmer {
    /// A confirmer with a fresh random key.
    pub(crate) fn new() -> Result<Self, String> {
        let mut secret = [0u8; 32];
        SystemRandom::new()
            .fill(&mut secret)
            .map_err(|_| "the system's random source failed".to_owned())?;
        Ok(Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, &secret),
        })
    }

    /// The token of `action` (tool, arguments and plan) for `caller` (the
    /// request's bearer token over HTTP; empty on standard input and
    /// output, which has one caller).
    pub(crate) fn token(&self, caller: &str, action: &Value) -> String {
        cca_model::hex::encode(hmac::sign(&self.key, &signed(caller, action)).as_ref())
    }

    /// Whether `token` is the token of `action` for `caller`.
    pub(crate) fn holds(&self, caller: &str, action: &Value, token: &str) -> bool {
        let Some(tag) = cca_model::hex::decode(token) else {
            return false;
        };
        hmac::verify(&self.key, &signed(caller, action), &tag).is_ok()
    }
}

/// What a token signs: the caller, then the action.
fn signed(caller: &str, action: &Value) -> Vec<u8> {
    let mut bytes = caller.as_bytes().to_vec();
    bytes.push(b'\n');
    bytes.extend_from_slice(action.to_string().as_bytes());
    bytes
}

#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct ApplyArgs {
    /// The program: the text of a `.cca` file (no includes).
    pub(crate) program: String,
    /// Also delete services the program does not name.
    #[serde(default)]
    pub(crate) prune: bool,
    /// The `confirm` token of this plan's answer; none: only plan.
    pub(crate) confirm: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct ScaleArgs {
    pub(crate) service: String,
    /// The replicas wanted.
    pub(crate) replicas: u32,
    /// The `confirm` token of this plan's answer; none: only plan.
    pub(crate) confirm: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct RollbackArgs {
    pub(crate) service: String,
    /// The version to go back to (a hash or unique prefix, as
    /// `describe_service` shows); none: the rollout's previous one.
    pub(crate) to: Option<String>,
    /// The `confirm` token of this plan's answer; none: only plan.
    pub(crate) confirm: Option<String>,
}

#[tool_router(router = write_router, vis = "pub(crate)")]
impl CcaMcp {
    #[tool(
        description = "Apply a .cca program to the cluster. Call without `confirm` to get the \
                       plan (what would be created, changed, deleted) and a confirm token; call \
                       again with the same arguments and that token to apply it."
    )]
    async fn apply_program(
        &self,
        Parameters(args): Parameters<ApplyArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let program = compile(&args.program)?;
        let plan = self
            .client()
            .diff(&program, args.prune)
            .await
            .map_err(api_error)?;
        let action = json!({
            "tool": "apply_program",
            "program": args.program,
            "prune": args.prune,
            "plan": plan,
        });
        if !self.confirmed(&action, args.confirm.as_deref())? {
            return self.plan_answer(&action, plan_value(&plan)?);
        }
        let report = self
            .client()
            .apply(&program, args.prune)
            .await
            .map_err(api_error)?;
        self.answer_value(json!({"applied": report}))
    }

    #[tool(
        description = "Set a service's replicas. Call without `confirm` to get the plan (from \
                       how many to how many) and a confirm token; call again with the same \
                       arguments and that token to scale."
    )]
    async fn scale_service(
        &self,
        Parameters(args): Parameters<ScaleArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let detail = self
            .client()
            .service(&args.service)
            .await
            .map_err(api_error)?;
        let plan = json!({
            "service": args.service,
            "replicas_now": detail.summary.replicas,
            "replicas_after": args.replicas,
        });
        let action = json!({"tool": "scale_service", "plan": plan});
        if !self.confirmed(&action, args.confirm.as_deref())? {
            return self.plan_answer(&action, plan);
        }
        let report = self
            .client()
            .scale(&args.service, args.replicas)
            .await
            .map_err(api_error)?;
        self.answer_value(json!({"scaled": report}))
    }

    #[tool(
        description = "Roll a service back to an older version of its spec. Call without \
                       `confirm` to get the plan (the rollout as it is, the version to go back \
                       to) and a confirm token; call again with the same arguments and that \
                       token to roll back."
    )]
    async fn rollback_service(
        &self,
        Parameters(args): Parameters<RollbackArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let status = self
            .client()
            .rollout(&args.service)
            .await
            .map_err(api_error)?;
        let plan = json!({
            "service": args.service,
            "version_now": status.spec_version,
            "back_to": args.to.as_deref().unwrap_or("the rollout's previous version"),
            "rollout": status,
        });
        let action = json!({"tool": "rollback_service", "plan": plan});
        if !self.confirmed(&action, args.confirm.as_deref())? {
            return self.plan_answer(&action, plan);
        }
        let report = self
            .client()
            .undo_rollout(&args.service, args.to.as_deref())
            .await
            .map_err(api_error)?;
        self.answer_value(json!({"rolled_back": report}))
    }
}

impl CcaMcp {
    /// Whether `confirm` is this plan's token: `false` without one (the
    /// caller only plans), an error with one that is not (the plan changed,
    /// or the token was for other arguments).
    fn confirmed(&self, action: &Value, confirm: Option<&str>) -> Result<bool, ErrorData> {
        let Some(token) = confirm else {
            return Ok(false);
        };
        let confirmer = self.confirmer()?;
        if confirmer.holds(self.caller(), action, token) {
            return Ok(true);
        }
        Err(ErrorData::invalid_params(
            "the confirm token is not this plan's: the cluster changed since it was planned, or \
             the arguments differ; nothing was done. Plan again (call without confirm) and \
             confirm the new plan",
            Some(
                json!({"plan": action["plan"], "confirm": confirmer.token(self.caller(), action)}),
            ),
        ))
    }

    fn plan_answer(&self, action: &Value, plan: Value) -> Result<CallToolResult, ErrorData> {
        self.answer_value(json!({
            "plan": plan,
            "confirm": self.confirmer()?.token(self.caller(), action),
            "nothing_done": "this is only the plan: call again with the same arguments and \
                             this confirm token to carry it out",
        }))
    }
}

fn plan_value(plan: &cca_wire::types::ApplyReport) -> Result<Value, ErrorData> {
    serde_json::to_value(plan).map_err(|error| ErrorData::internal_error(error.to_string(), None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_holds_for_its_action_only() {
        let confirmer = Confirmer::new().expect("random");
        let action =
            json!({"tool": "scale_service", "plan": {"service": "web", "replicas_after": 3}});
        let token = confirmer.token("alice", &action);
        assert!(confirmer.holds("alice", &action, &token));
        assert!(!confirmer.holds("bob", &action, &token), "another caller's");
        let other =
            json!({"tool": "scale_service", "plan": {"service": "web", "replicas_after": 4}});
        assert!(!confirmer.holds("alice", &other, &token));
        for forged in ["", "zz", &token[..10], "00"] {
            assert!(!confirmer.holds("alice", &action, forged), "{forged}");
        }
        let another_session = Confirmer::new().expect("random");
        assert!(!another_session.holds("alice", &action, &token));
    }
}
