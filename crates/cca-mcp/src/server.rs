//! The MCP tools: the cluster's state read through the API with the
//! caller's own credentials (the API authorizes and audits each call as it
//! does the CLI's), each answer compact JSON within the token budget,
//! problems first, a cursor for more. Bad arguments and refusals are MCP
//! errors that say what to do; nothing here panics on input.

use std::sync::Arc;

use cca_wire::types::{InstanceSummary, NodeSummary};
use cca_wire::{Client, ClientError, EventQuery, InstanceQuery};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::budget::{self, Cursor};
use crate::writes::Confirmer;

/// Lines `tail_logs` reads when not told.
const DEFAULT_LOG_LINES: usize = 100;
/// The most lines `tail_logs` reads.
const MAX_LOG_LINES: usize = 2_000;

/// The MCP server of one caller: their API client, the answer budget,
/// and (with writes allowed) what signs the plans of writes.
#[derive(Clone)]
pub struct CcaMcp {
    client: Arc<Client>,
    budget: usize,
    confirmer: Option<Arc<Confirmer>>,
    /// Over HTTP, the bearer token this copy acts with (write plans are
    /// bound to it).
    caller: Option<Arc<str>>,
    tool_router: ToolRouter<Self>,
}

impl std::fmt::Debug for CcaMcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CcaMcp")
            .field("server", &self.client.base_url())
            .field("budget", &self.budget)
            .field("writes", &self.confirmer.is_some())
            .finish_non_exhaustive()
    }
}

/// A page of a list.
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub(crate) struct PageArgs {
    /// The `next_cursor` of the previous answer; none for the first page.
    pub(crate) cursor: Option<String>,
    /// At most this many rows (the token budget may stop a page sooner).
    pub(crate) limit: Option<usize>,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
pub(crate) struct ListServicesArgs {
    /// Only services with every one of these tags, each `key=value`.
    #[serde(default)]
    pub(crate) tags: Vec<String>,
    #[serde(flatten)]
    pub(crate) page: PageArgs,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct NameArgs {
    /// The name (of the service or node).
    pub(crate) name: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct InstanceArgs {
    /// The instance's id (as `list_instances` shows it).
    pub(crate) id: String,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
pub(crate) struct ListInstancesArgs {
    /// Only this service's instances.
    pub(crate) service: Option<String>,
    /// Only instances on this node.
    pub(crate) node: Option<String>,
    /// `running` (only running ones), `pending` (also a row for each
    /// instance the scheduler could not place) or `all` (stopped ones too);
    /// default: the placed ones, whatever their state.
    pub(crate) state: Option<String>,
    #[serde(flatten)]
    pub(crate) page: PageArgs,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
pub(crate) struct ExplainArgs {
    /// Only this service; none: every service with pending demand.
    pub(crate) service: Option<String>,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
pub(crate) struct EventsArgs {
    /// Only events about this subject (`service/web`, `node/n1`,
    /// `instance/web-1a2b`).
    pub(crate) subject: Option<String>,
    /// Only events of the last this many minutes.
    pub(crate) since_minutes: Option<u64>,
    #[serde(flatten)]
    pub(crate) page: PageArgs,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct DiffArgs {
    /// The program: the text of a `.cca` file (no includes).
    pub(crate) program: String,
    /// Also show the services the program does not name as deleted.
    #[serde(default)]
    pub(crate) prune: bool,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
pub(crate) struct LogsArgs {
    /// One instance's output.
    pub(crate) instance: Option<String>,
    /// Every instance of a service, each line prefixed `[instance]`.
    pub(crate) service: Option<String>,
    /// The last this many lines (default 100, at most 2000); the budget
    /// may keep fewer, the newest.
    pub(crate) lines: Option<usize>,
}

#[tool_router(router = tool_router)]
impl CcaMcp {
    /// A server answering with `client`'s credentials, each answer within
    /// about `budget` tokens (at least [`budget::MIN_TOKEN_BUDGET`]).
    pub fn new(client: Client, budget: usize) -> Self {
        Self {
            // Every call is on record as its caller's, reads too.
            client: Arc::new(client.auditing_reads(AUDITED_AS)),
            budget: budget.max(budget::MIN_TOKEN_BUDGET),
            confirmer: None,
            caller: None,
            tool_router: Self::tool_router(),
        }
    }

    /// The same server with the tools that change the cluster too (each
    /// planned, then carried out only with the plan's confirm token).
    pub fn allowing_writes(mut self) -> Result<Self, crate::Error> {
        let confirmer = Confirmer::new().map_err(crate::Error::Start)?;
        self.confirmer = Some(Arc::new(confirmer));
        self.tool_router.merge(Self::write_router());
        Ok(self)
    }

    #[tool(
        description = "What applying a .cca program (the text of one file) would change: \
                       services and facts created, changed and deleted. Changes nothing. A \
                       program with errors is answered with the compiler's diagnostics."
    )]
    async fn diff_program(
        &self,
        Parameters(args): Parameters<DiffArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let program = compile(&args.program)?;
        let plan = self
            .client
            .diff(&program, args.prune)
            .await
            .map_err(api_error)?;
        self.answer(budget::fit(to_value(&plan)?, self.budget))
    }

    #[tool(
        description = "The cluster at a glance: nodes by state, services, instances by state, \
                       demand the scheduler could not place (with the reason), and whether \
                       lost-node replacement is paused. Start here."
    )]
    async fn cluster_status(&self) -> Result<CallToolResult, ErrorData> {
        let status = self.client.status().await.map_err(api_error)?;
        let mut answer = to_value(&status)?;
        if let Value::Object(object) = &mut answer {
            object.remove("invalid_facts");
            object.insert(
                "healthy".into(),
                Value::Bool(status.unplaced.is_empty() && status.nodes.unreachable == 0),
            );
        }
        self.answer(budget::fit(answer, self.budget))
    }

    #[tool(
        description = "Services, a row each (replicas wanted, instances running, demand \
                       unplaced, VIP, DNS name), those short of their replicas first. Paged: \
                       pass next_cursor for more."
    )]
    async fn list_services(
        &self,
        Parameters(args): Parameters<ListServicesArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let cursor = cursor(&args.page)?;
        let mut services = self.client.services(&args.tags).await.map_err(api_error)?;
        services.sort_by_key(|s| {
            (
                s.running >= s.replicas as usize && s.unplaced == 0,
                s.name.clone(),
            )
        });
        let short = services
            .iter()
            .filter(|s| s.running < s.replicas as usize || s.unplaced > 0)
            .count();
        let rows = services
            .iter()
            .map(|s| {
                json!({
                    "name": s.name,
                    "workload": s.workload,
                    "replicas": s.replicas,
                    "running": s.running,
                    "unplaced": s.unplaced,
                    "vip": s.vip,
                    "dns": s.dns,
                })
            })
            .collect();
        let header = json!({"short_of_replicas": short});
        self.page(header, rows, cursor, args.page.limit)
    }

    #[tool(
        description = "One service: its spec, its instances, why any demand is pending, its \
                       endpoints, recent events and rollout. Long lists are cut to the token \
                       budget (the answer says how many rows were left out)."
    )]
    async fn describe_service(
        &self,
        Parameters(args): Parameters<NameArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let detail = self.client.service(&args.name).await.map_err(api_error)?;
        self.answer(budget::fit(to_value(&detail)?, self.budget))
    }

    #[tool(
        description = "Instances, a row each (service, node, state, health, restarts, \
                       address), unhealthy and not-running ones first. Filter by service, node \
                       and state. Paged: pass next_cursor for more."
    )]
    async fn list_instances(
        &self,
        Parameters(args): Parameters<ListInstancesArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let cursor = cursor(&args.page)?;
        let mut query = InstanceQuery {
            service: args.service.clone(),
            node: args.node.clone(),
            ..InstanceQuery::default()
        };
        match args.state.as_deref() {
            None => {}
            Some("running") => query.running = true,
            Some("pending") => query.pending = true,
            Some("all") => query.all = true,
            Some(other) => {
                return Err(ErrorData::invalid_params(
                    format!("state \"{other}\": use running, pending or all (or none)"),
                    None,
                ));
            }
        }
        let mut instances = self.client.instances(&query).await.map_err(api_error)?;
        let fine = |i: &InstanceSummary| i.state == "running" && i.healthy != Some(false);
        instances.sort_by_key(|i| (fine(i), i.service.clone(), i.id.clone()));
        let troubled = instances.iter().filter(|i| !fine(i)).count();
        let rows = instances
            .iter()
            .map(|i| {
                json!({
                    "id": i.id,
                    "service": i.service,
                    "node": i.node,
                    "state": i.state,
                    "healthy": i.healthy,
                    "restarts": i.restarts,
                    "address": i.address,
                    "stopping": i.stopping,
                })
            })
            .collect();
        self.page(
            json!({"not_running_or_unhealthy": troubled}),
            rows,
            cursor,
            args.page.limit,
        )
    }

    #[tool(description = "One instance: its state, health, restarts, node, address and placement.")]
    async fn describe_instance(
        &self,
        Parameters(args): Parameters<InstanceArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let detail = self.client.instance(&args.id).await.map_err(api_error)?;
        self.answer(budget::fit(to_value(&detail)?, self.budget))
    }

    #[tool(
        description = "Nodes, a row each (status, draining, disabled, instances, CPU and memory \
                       allocated of capacity), unreachable, draining and disabled ones first. \
                       Paged: pass next_cursor for more."
    )]
    async fn list_nodes(
        &self,
        Parameters(args): Parameters<PageArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let cursor = cursor(&args)?;
        let mut nodes = self.client.nodes().await.map_err(api_error)?;
        let fine = |n: &NodeSummary| n.status == "ready" && !n.draining && !n.disabled;
        nodes.sort_by_key(|n| (fine(n), n.name.clone()));
        let troubled = nodes.iter().filter(|n| !fine(n)).count();
        let rows = nodes
            .iter()
            .map(|n| {
                json!({
                    "name": n.name,
                    "status": n.status,
                    "draining": n.draining,
                    "disabled": n.disabled,
                    "instances": n.instances,
                    "cpu_millicores": format!("{} of {}", n.cpu_allocated.0, n.cpu.0),
                    "memory": format!("{} of {}", n.memory_allocated.human(), n.memory.human()),
                    "zone": n.zone,
                })
            })
            .collect();
        self.page(
            json!({"not_ready_draining_or_disabled": troubled}),
            rows,
            cursor,
            args.limit,
        )
    }

    #[tool(
        description = "One node: capacity and allocation, condition, last heartbeat, control \
                       state (draining, disabled), its instances."
    )]
    async fn describe_node(
        &self,
        Parameters(args): Parameters<NameArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let detail = self.client.node(&args.name).await.map_err(api_error)?;
        self.answer(budget::fit(to_value(&detail)?, self.budget))
    }

    #[tool(
        description = "Why demand is pending: for each service (or the one named) the instances \
                       the scheduler could not place, the reason, the constraint that failed, \
                       the nearest node and since when; and a service's instances that are \
                       placed but not running."
    )]
    async fn explain_pending(
        &self,
        Parameters(args): Parameters<ExplainArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let answer = match &args.service {
            None => {
                let status = self.client.status().await.map_err(api_error)?;
                let pending: Vec<Value> = status.unplaced.iter().map(explain_unplaced).collect();
                json!({
                    "services_with_pending_demand": pending.len(),
                    "pending": pending,
                })
            }
            Some(name) => {
                let detail = self.client.service(name).await.map_err(api_error)?;
                let not_running: Vec<Value> = detail
                    .instances
                    .iter()
                    .filter(|i| i.state != "running" || i.healthy == Some(false))
                    .map(|i| {
                        json!({"id": i.id, "node": i.node, "state": i.state,
                               "healthy": i.healthy, "restarts": i.restarts})
                    })
                    .collect();
                json!({
                    "service": name,
                    "replicas": detail.summary.replicas,
                    "running": detail.summary.running,
                    "unplaced": detail.unplaced.as_ref().map(explain_unplaced),
                    "placed_but_not_running": not_running,
                })
            }
        };
        self.answer(budget::fit(answer, self.budget))
    }

    #[tool(
        description = "The cluster's events, newest first (what was scheduled, started, \
                       failed, replaced, scaled, rolled back), optionally about one subject or \
                       of the last minutes. Paged: pass next_cursor for more."
    )]
    async fn list_events(
        &self,
        Parameters(args): Parameters<EventsArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let cursor = cursor(&args.page)?;
        let since = args.since_minutes.map(|minutes| {
            let span = i64::try_from(minutes.saturating_mul(60_000)).unwrap_or(i64::MAX);
            cca_model::clock::now_millis().saturating_sub(span)
        });
        let query = EventQuery {
            since,
            subject: args.subject.clone(),
            limit: None,
        };
        let events = self.client.events(&query).await.map_err(api_error)?;
        let rows = events
            .iter()
            .rev()
            .map(to_value)
            .collect::<Result<Vec<_>, _>>()?;
        self.page(json!({}), rows, cursor, args.page.limit)
    }

    #[tool(
        description = "The last lines of an instance's output (or of every instance of a \
                       service), newest last; the budget keeps the newest that fit."
    )]
    async fn tail_logs(
        &self,
        Parameters(args): Parameters<LogsArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let lines = args.lines.unwrap_or(DEFAULT_LOG_LINES);
        if lines == 0 || lines > MAX_LOG_LINES {
            return Err(ErrorData::invalid_params(
                format!("lines {lines}: ask for 1 to {MAX_LOG_LINES}"),
                None,
            ));
        }
        let (source, mut stream) = match (&args.instance, &args.service) {
            (Some(id), None) => (
                format!("instance/{id}"),
                self.client.instance_logs(id, Some(lines), false).await,
            ),
            (None, Some(name)) => (
                format!("service/{name}"),
                self.client.service_logs(name, Some(lines), false).await,
            ),
            _ => {
                return Err(ErrorData::invalid_params(
                    "name either `instance` or `service`, not both or neither",
                    None,
                ));
            }
        };
        let mut read = Vec::new();
        if let Ok(stream) = &mut stream {
            while let Some(line) = stream.next().await {
                read.push(line.map_err(api_error)?);
            }
        }
        stream.map_err(api_error)?;
        let kept = newest_that_fit(read, self.budget);
        self.answer(json!({"source": source, "lines": kept.0, "older_lines_omitted": kept.1}))
    }
}

/// The name the API's audit log gives this server's reads (`via mcp`).
const AUDITED_AS: &str = "mcp";

#[tool_handler(router = self.tool_router)]
impl ServerHandler for CcaMcp {
    /// Routes the call, and logs it (target `cca_mcp::call`: the tool, how
    /// it ended, how long it took; never the arguments, which may hold a
    /// program's text).
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let tool = request.name.clone();
        let started = std::time::Instant::now();
        // Over HTTP, each request acts as its own bearer token's caller.
        let token = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| {
                crate::http::bearer(parts.headers.get(axum::http::header::AUTHORIZATION))
            })
            .map(str::to_owned);
        let caller = match token {
            Some(token) => self.acting_for(&token),
            None => self.clone(),
        };
        let call = ToolCallContext::new(&caller, request, context);
        let answer = caller.tool_router.call(call).await;
        let outcome = match &answer {
            Ok(CallToolResponse::Complete(result)) if result.is_error == Some(true) => {
                "failed".to_owned()
            }
            Ok(_) => "ok".to_owned(),
            Err(error) => format!("error {}: {}", error.code.0, error.message),
        };
        tracing::info!(
            target: "cca_mcp::call",
            %tool,
            %outcome,
            ms = started.elapsed().as_secs_f64() * 1e3,
            "MCP tool call"
        );
        answer
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("cca", env!("CARGO_PKG_VERSION")))
            .with_instructions(format!(
                "CCattler cluster at {}, read with the caller's own credentials. Start with \
                 cluster_status; list_* tools answer in pages (pass next_cursor), problems \
                 first; describe_* tools cut long lists to about {} tokens and say what they \
                 left out; explain_pending says why demand is not placed or not running.",
                self.client.base_url(),
                self.budget
            ))
    }
}

impl CcaMcp {
    /// This server acting with `token` (a user's bearer token).
    fn acting_for(&self, token: &str) -> Self {
        Self {
            client: Arc::new(self.client.as_ref().clone().with_bearer(token)),
            caller: Some(token.into()),
            ..self.clone()
        }
    }

    /// Who write plans are bound to: the bearer token over HTTP.
    pub(crate) fn caller(&self) -> &str {
        self.caller.as_deref().unwrap_or_default()
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// What signs plans (the write tools are routed only with one).
    pub(crate) fn confirmer(&self) -> Result<&Confirmer, ErrorData> {
        self.confirmer.as_deref().ok_or_else(|| {
            ErrorData::invalid_request(
                "this server does not change the cluster: start it with --allow-writes",
                None,
            )
        })
    }

    /// `value` within the budget, as the answer.
    pub(crate) fn answer_value(&self, value: Value) -> Result<CallToolResult, ErrorData> {
        self.answer(budget::fit(value, self.budget))
    }

    fn answer(&self, value: Value) -> Result<CallToolResult, ErrorData> {
        let text = serde_json::to_string(&value)
            .map_err(|error| ErrorData::internal_error(error.to_string(), None))?;
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]))
    }

    /// `header`'s fields and the page of `rows` from `cursor`.
    fn page(
        &self,
        header: Value,
        rows: Vec<Value>,
        cursor: Cursor,
        limit: Option<usize>,
    ) -> Result<CallToolResult, ErrorData> {
        let page = budget::page(rows, cursor, limit, self.budget, budget::tokens(&header))
            .map_err(|message| ErrorData::invalid_params(message, None))?;
        let mut answer = to_value(&page)?;
        if let (Value::Object(answer), Value::Object(header)) = (&mut answer, header) {
            answer.extend(header);
        }
        self.answer(answer)
    }
}

/// The newest of `lines` that fit in `budget` tokens, oldest first, and
/// how many older ones were left out.
fn newest_that_fit(lines: Vec<String>, budget: usize) -> (Vec<String>, usize) {
    // Room for the answer's frame.
    let mut room = budget.saturating_sub(100);
    let mut kept = Vec::new();
    for line in lines.iter().rev() {
        let cost = budget::tokens(line) + 1;
        if cost > room {
            break;
        }
        room -= cost;
        kept.push(line.clone());
    }
    kept.reverse();
    let omitted = lines.len() - kept.len();
    (kept, omitted)
}

fn explain_unplaced(unplaced: &cca_model::cluster::Unplaced) -> Value {
    json!({
        "service": unplaced.service,
        "instances": unplaced.count,
        "reason": unplaced.reason,
        "constraint": unplaced.constraint,
        "nearest_node": unplaced.nearest_node,
        "since_ms": unplaced.since,
    })
}

/// Compiles the text of one `.cca` file; its errors are an invalid-params
/// error with the compiler's diagnostics.
pub(crate) fn compile(text: &str) -> Result<cca_model::spec::Program, ErrorData> {
    cca_dsl::compile::compile_text(text).map_err(|report| {
        ErrorData::invalid_params(
            format!("the program has errors; nothing was sent to the server:\n{report}"),
            None,
        )
    })
}

fn cursor(page: &PageArgs) -> Result<Cursor, ErrorData> {
    Cursor::parse(page.cursor.as_deref())
        .map_err(|message| ErrorData::invalid_params(message, None))
}

fn to_value(value: &impl serde::Serialize) -> Result<Value, ErrorData> {
    serde_json::to_value(value).map_err(|error| ErrorData::internal_error(error.to_string(), None))
}

/// The API's refusal as an MCP error: what the caller asked for that is
/// wrong (not found, not allowed) is an invalid request with the API's
/// own message; a server that cannot answer is an internal error.
pub(crate) fn api_error(error: ClientError) -> ErrorData {
    let message = error.to_string();
    match error.status() {
        Some(400 | 404 | 409 | 422) => ErrorData::invalid_params(message, None),
        Some(401 | 403) => ErrorData::invalid_request(
            format!("{message}: the caller's credentials do not allow this"),
            None,
        ),
        _ => ErrorData::internal_error(message, None),
    }
}
