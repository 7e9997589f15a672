//! `cca user create|ls|rm|token` and `cca role create|ls|rm`: who may use
//! the cluster and what they may do (docs/authorization.md). `user token`
//! prints a signed token once, for `cca login` or `$CCA_TOKEN`.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use cca_model::access::{Action, Conditions, Effect, Resource, RoleRecord, Rule, TenantCondition};
use cca_wire::types::{UserRequest, UserTokenRequest};
use clap::{Args, Subcommand};

use super::commands::client;
use super::output::{self, age, now_millis, or_dash};
use super::{OutputArgs, ServerAddr};

/// `cca user …`
#[derive(Debug, Args)]
pub(crate) struct UserArgs {
    #[command(subcommand)]
    pub(crate) command: UserCommand,
}

#[derive(Debug, Subcommand)]
pub(crate) enum UserCommand {
    /// Make a user (or change one) with roles and an optional tenant.
    Create(CreateUserArgs),
    /// List users.
    #[command(alias = "list")]
    Ls(ListArgs),
    /// Remove a user; their certificates are revoked, their tokens stop working.
    Rm(NameArgs),
    /// Print a signed token for a user (shown once; `cca login --token`).
    Token(TokenArgs),
}

/// `cca role …`
#[derive(Debug, Args)]
pub(crate) struct RoleArgs {
    #[command(subcommand)]
    pub(crate) command: RoleCommand,
}

#[derive(Debug, Subcommand)]
pub(crate) enum RoleCommand {
    /// Make a custom role (or change one) from allow and deny rules.
    Create(CreateRoleArgs),
    /// List the built-in and custom roles.
    #[command(alias = "list")]
    Ls(ListArgs),
    /// Remove a custom role (its holders lose what it allowed).
    Rm(NameArgs),
}

/// `cca user create NAME --role ROLE… [--tenant T]`
#[derive(Debug, Args)]
pub(crate) struct CreateUserArgs {
    #[command(flatten)]
    addr: ServerAddr,
    name: String,
    /// A role the user holds (admin, operator, developer, viewer or a custom one); may repeat.
    #[arg(long = "role", required = true, value_name = "ROLE")]
    roles: Vec<String>,
    /// The tenant the user belongs to (default: cluster-wide).
    #[arg(long)]
    tenant: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    addr: ServerAddr,
    #[command(flatten)]
    out: OutputArgs,
}

#[derive(Debug, Args)]
pub(crate) struct NameArgs {
    #[command(flatten)]
    addr: ServerAddr,
    name: String,
}

/// `cca user token NAME [--ttl 8h]`
#[derive(Debug, Args)]
pub(crate) struct TokenArgs {
    #[command(flatten)]
    addr: ServerAddr,
    name: String,
    /// How long the token is valid (at most 90d).
    #[arg(long, default_value = "8h", value_name = "DURATION", value_parser = crate::flags::duration)]
    ttl: Duration,
}

/// `cca role create NAME [--allow ACTION:RESOURCE]… [--deny ACTION:RESOURCE]… [--tenant …] [--tag K=V]…`
#[derive(Debug, Args)]
pub(crate) struct CreateRoleArgs {
    #[command(flatten)]
    addr: ServerAddr,
    name: String,
    /// Allow an action on a kind of object (`read:service`, `exec:instance`, `*:secret`); may repeat.
    #[arg(long = "allow", value_name = "ACTION:RESOURCE")]
    allow: Vec<String>,
    /// Deny one (wins over every allow); may repeat.
    #[arg(long = "deny", value_name = "ACTION:RESOURCE")]
    deny: Vec<String>,
    /// Whose objects the rules apply to: `own` (the user's tenant), `any`,
    /// or a comma-separated list of tenants.
    #[arg(long, default_value = "own", value_name = "own|any|T1,T2")]
    tenant: String,
    /// Only objects with this tag; may repeat (all must match).
    #[arg(long = "tag", value_name = "KEY=VALUE")]
    tags: Vec<String>,
    #[arg(long, default_value = "")]
    description: String,
}

pub(super) async fn run_user(args: UserArgs) -> Result<()> {
    match args.command {
        UserCommand::Create(args) => {
            let request = UserRequest {
                roles: args.roles.clone(),
                tenant: args.tenant.clone(),
            };
            let user = client(&args.addr)?.put_user(&args.name, &request).await?;
            output::line(&format!(
                "user/{} with roles {}",
                user.name,
                user.roles.join(", ")
            ));
        }
        UserCommand::Ls(args) => {
            let users = client(&args.addr)?.users().await?;
            if !output::structured(args.out.output, &users)? {
                let now = now_millis();
                let rows = users
                    .into_iter()
                    .map(|user| {
                        vec![
                            user.name,
                            user.roles.join(","),
                            or_dash(user.tenant),
                            age(Some(user.created_at), now),
                            or_dash(Some(user.created_by)),
                        ]
                    })
                    .collect();
                output::table(&["name", "roles", "tenant", "age", "created by"], rows);
            }
        }
        UserCommand::Rm(args) => {
            let user = client(&args.addr)?.delete_user(&args.name).await?;
            output::line(&format!(
                "user/{} removed; their certificates are revoked",
                user.name
            ));
        }
        UserCommand::Token(args) => {
            let request = UserTokenRequest {
                ttl_secs: Some(args.ttl.as_secs().max(1)),
            };
            let issued = client(&args.addr)?.user_token(&args.name, &request).await?;
            output::line(&issued.token);
        }
    }
    Ok(())
}

pub(super) async fn run_role(args: RoleArgs) -> Result<()> {
    match args.command {
        RoleCommand::Create(args) => {
            let role = role_of(&args)?;
            let role = client(&args.addr)?.put_role(&role).await?;
            output::line(&format!(
                "role/{} with {} rules",
                role.name,
                role.rules.len()
            ));
        }
        RoleCommand::Ls(args) => {
            let roles = client(&args.addr)?.roles().await?;
            if !output::structured(args.out.output, &roles)? {
                let rows = roles
                    .into_iter()
                    .map(|info| {
                        vec![
                            info.role.name.clone(),
                            if info.builtin { "built-in" } else { "custom" }.to_owned(),
                            info.role
                                .rules
                                .iter()
                                .map(ToString::to_string)
                                .collect::<Vec<_>>()
                                .join("; "),
                        ]
                    })
                    .collect();
                output::table(&["name", "kind", "rules"], rows);
            }
        }
        RoleCommand::Rm(args) => {
            let role = client(&args.addr)?.delete_role(&args.name).await?;
            output::line(&format!("role/{} removed", role.name));
        }
    }
    Ok(())
}

/// The role `cca role create` describes, checked for form here (the
/// server checks it again).
fn role_of(args: &CreateRoleArgs) -> Result<RoleRecord> {
    if args.allow.is_empty() && args.deny.is_empty() {
        bail!("a role needs at least one --allow or --deny rule");
    }
    let tenant = match args.tenant.as_str() {
        "own" => TenantCondition::Own,
        "any" => TenantCondition::Any,
        list => TenantCondition::In(list.split(',').map(|t| t.trim().to_owned()).collect()),
    };
    let mut tags = BTreeMap::new();
    for tag in &args.tags {
        let (key, value) = tag
            .split_once('=')
            .with_context(|| format!("--tag `{tag}` must be KEY=VALUE"))?;
        tags.insert(key.to_owned(), value.to_owned());
    }
    let when = Conditions { tenant, tags };
    let rule = |effect: Effect, pair: &String| -> Result<Rule> {
        let (action, resource) = pair
            .split_once(':')
            .with_context(|| format!("`{pair}` must be ACTION:RESOURCE, e.g. read:service"))?;
        let action: Action = action.parse().with_context(|| format!("`{pair}`"))?;
        let resource: Resource = resource.parse().with_context(|| format!("`{pair}`"))?;
        Ok(Rule {
            effect,
            actions: vec![action],
            resources: vec![resource],
            when: when.clone(),
        })
    };
    let mut rules = Vec::new();
    for pair in &args.allow {
        rules.push(rule(Effect::Allow, pair)?);
    }
    for pair in &args.deny {
        rules.push(rule(Effect::Deny, pair)?);
    }
    Ok(RoleRecord {
        name: args.name.clone(),
        description: args.description.clone(),
        rules,
    })
}
