//! [`FakeFilter`]: a recording [`PacketFilter`] for unit tests. It keeps a
//! model of the tables the batches would leave in the kernel — chains with
//! their rules, sets and maps with their elements — and refuses what the
//! kernel refuses (a chain deleted while rules or map elements still name
//! it, an element deleted that is not there, a key added twice with two
//! values, a reference to a missing set or chain), all or nothing per
//! batch. So a test can check both the commands a change produced and that
//! an incremental change leaves exactly what a rebuild would. It also
//! holds conntrack entries for the UDP cleanup, and fails the operations
//! it is told to fail.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::{Mutex, MutexGuard, PoisonError};

use nftables::expr::{Expression, NamedExpression, Verdict};
use nftables::schema::{FlushObject, NfCmd, NfListObject};
use serde_json::Value;

use super::batch::{Batch, Command};
use super::error::{Error, Result};
use super::kernel::{PacketFilter, UdpCleanup};

/// One recorded call.
#[derive(Clone, Debug, PartialEq)]
pub enum Call {
    Apply(Batch),
    ListTable(String),
    DeleteTable(String),
    DeleteConntrack(UdpCleanup),
}

impl Call {
    /// The operation name `fail` matches on, e.g. `"apply"`.
    pub fn operation(&self) -> &'static str {
        match self {
            Call::Apply(_) => "apply",
            Call::ListTable(_) => "list_table",
            Call::DeleteTable(_) => "delete_table",
            Call::DeleteConntrack(_) => "delete_conntrack",
        }
    }
}

/// A chain of the model: whether it hooks into the stack, and its rules.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FakeChain {
    pub base: bool,
    /// Each rule's statements as JSON.
    pub rules: Vec<Value>,
}

/// A set or map of the model: elements by their key's JSON, with the
/// mapped value's JSON for a map.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FakeSet {
    pub map: bool,
    pub elements: BTreeMap<String, Option<Value>>,
}

/// One `ip` table of the model.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FakeTable {
    pub chains: BTreeMap<String, FakeChain>,
    pub sets: BTreeMap<String, FakeSet>,
}

/// A UDP conntrack entry: original destination and reply source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FakeFlow {
    pub destination: (Ipv4Addr, u16),
    pub reply_source: (Ipv4Addr, u16),
}

#[derive(Debug, Default)]
struct State {
    calls: Vec<Call>,
    failing: BTreeSet<&'static str>,
    tables: BTreeMap<String, FakeTable>,
    flows: BTreeSet<FakeFlow>,
}

/// A recording, modelling, failure-injecting packet filter.
#[derive(Debug, Default)]
pub struct FakeFilter {
    state: Mutex<State>,
}

impl FakeFilter {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking test must not poison every later assertion.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes every later call of `operation` (e.g. `"apply"`) fail.
    pub fn fail(&self, operation: &'static str) {
        self.lock().failing.insert(operation);
    }

    /// Stops failing `operation`.
    pub fn heal(&self, operation: &'static str) {
        self.lock().failing.remove(operation);
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// The batches applied (or refused) so far, in order.
    pub fn batches(&self) -> Vec<Batch> {
        self.calls()
            .into_iter()
            .filter_map(|call| match call {
                Call::Apply(batch) => Some(batch),
                _ => None,
            })
            .collect()
    }

    /// Forgets the recorded calls (the modelled tables stay).
    pub fn clear_calls(&self) {
        self.lock().calls.clear();
    }

    /// The model of `table`, if it exists.
    pub fn table(&self, table: &str) -> Option<FakeTable> {
        self.lock().tables.get(table).cloned()
    }

    /// Adds a UDP conntrack entry.
    pub fn add_flow(&self, flow: FakeFlow) {
        self.lock().flows.insert(flow);
    }

    /// The UDP conntrack entries left.
    pub fn flows(&self) -> BTreeSet<FakeFlow> {
        self.lock().flows.clone()
    }

    fn record(&self, call: Call) -> Result<MutexGuard<'_, State>> {
        let mut state = self.lock();
        let operation = call.operation();
        state.calls.push(call);
        if state.failing.contains(operation) {
            return Err(Error::Injected {
                operation: operation.into(),
            });
        }
        Ok(state)
    }
}

impl PacketFilter for FakeFilter {
    fn apply(&self, batch: &Batch) -> Result<()> {
        let mut state = self.record(Call::Apply(batch.clone()))?;
        let mut tables = state.tables.clone();
        let commands = batch.commands();
        for command in &commands {
            apply(&mut tables, command).map_err(|reason| Error::Apply {
                table: batch.table().to_owned(),
                commands: commands.len(),
                status: "refused by the fake".to_owned(),
                stderr: reason,
            })?;
        }
        state.tables = tables;
        Ok(())
    }

    fn list_table(&self, table: &str) -> Result<Option<String>> {
        let state = self.record(Call::ListTable(table.to_owned()))?;
        Ok(state.tables.get(table).map(|t| format!("{t:?}")))
    }

    fn delete_table(&self, table: &str) -> Result<()> {
        let mut state = self.record(Call::DeleteTable(table.to_owned()))?;
        state.tables.remove(table);
        Ok(())
    }

    fn delete_conntrack(&self, cleanup: &UdpCleanup) -> Result<usize> {
        let mut state = self.record(Call::DeleteConntrack(cleanup.clone()))?;
        let before = state.flows.len();
        state
            .flows
            .retain(|flow| !cleanup.is_stale(flow.destination, flow.reply_source));
        Ok(before - state.flows.len())
    }
}

type Tables = BTreeMap<String, FakeTable>;

fn json<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

fn table_mut<'a>(tables: &'a mut Tables, name: &str) -> Result<&'a mut FakeTable, String> {
    tables
        .get_mut(name)
        .ok_or_else(|| format!("no table {name}"))
}

/// Every `@set` and every jump/goto target named in a JSON value.
fn references(value: &Value, sets: &mut BTreeSet<String>, chains: &mut BTreeSet<String>) {
    match value {
        Value::String(text) => {
            if let Some(set) = text.strip_prefix('@') {
                sets.insert(set.to_owned());
            }
        }
        Value::Array(items) => items.iter().for_each(|v| references(v, sets, chains)),
        Value::Object(fields) => {
            for (key, field) in fields {
                if (key == "jump" || key == "goto")
                    && let Some(target) = field.get("target").and_then(Value::as_str)
                {
                    chains.insert(target.to_owned());
                }
                references(field, sets, chains);
            }
        }
        _ => {}
    }
}

/// Whether anything in `table` names chain `chain` or set `set`.
fn referenced(table: &FakeTable, chain: Option<&str>, set: Option<&str>) -> bool {
    let mut sets = BTreeSet::new();
    let mut chains = BTreeSet::new();
    for rule in table.chains.values().flat_map(|c| &c.rules) {
        references(rule, &mut sets, &mut chains);
    }
    for value in table
        .sets
        .values()
        .flat_map(|s| s.elements.values())
        .flatten()
    {
        references(value, &mut sets, &mut chains);
    }
    chain.is_some_and(|c| chains.contains(c)) || set.is_some_and(|s| sets.contains(s))
}

fn apply(tables: &mut Tables, command: &Command) -> Result<(), String> {
    let command = match command {
        Command::AddVerdictMap(map) => {
            let table = table_mut(tables, map.table())?;
            table.sets.entry(map.name().to_owned()).or_insert(FakeSet {
                map: true,
                elements: BTreeMap::new(),
            });
            return Ok(());
        }
        Command::Nft(command) => command,
    };
    match command {
        NfCmd::Add(NfListObject::Table(table)) => {
            tables.entry(table.name.to_string()).or_default();
        }
        NfCmd::Delete(NfListObject::Table(table)) => {
            tables
                .remove(table.name.as_ref())
                .ok_or_else(|| format!("delete of missing table {}", table.name))?;
        }
        NfCmd::Add(NfListObject::Chain(chain)) => {
            let table = table_mut(tables, &chain.table)?;
            table
                .chains
                .entry(chain.name.to_string())
                .or_insert(FakeChain {
                    base: chain.hook.is_some(),
                    rules: Vec::new(),
                });
        }
        NfCmd::Flush(FlushObject::Chain(chain)) => {
            let table = table_mut(tables, &chain.table)?;
            table
                .chains
                .get_mut(chain.name.as_ref())
                .ok_or_else(|| format!("flush of missing chain {}", chain.name))?
                .rules
                .clear();
        }
        NfCmd::Delete(NfListObject::Chain(chain)) => {
            let table = table_mut(tables, &chain.table)?;
            let held = table
                .chains
                .get(chain.name.as_ref())
                .ok_or_else(|| format!("delete of missing chain {}", chain.name))?;
            if !held.rules.is_empty() {
                return Err(format!("delete of chain {} that has rules", chain.name));
            }
            table.chains.remove(chain.name.as_ref());
            if referenced(table, Some(&chain.name), None) {
                return Err(format!("delete of chain {} still in use", chain.name));
            }
        }
        NfCmd::Add(NfListObject::Rule(rule)) => {
            let table = table_mut(tables, &rule.table)?;
            let statements = json(&rule.expr);
            let mut sets = BTreeSet::new();
            let mut chains = BTreeSet::new();
            references(&statements, &mut sets, &mut chains);
            if let Some(missing) = sets.iter().find(|s| !table.sets.contains_key(*s)) {
                return Err(format!("rule names missing set {missing}"));
            }
            if let Some(missing) = chains.iter().find(|c| !table.chains.contains_key(*c)) {
                return Err(format!("rule jumps to missing chain {missing}"));
            }
            table
                .chains
                .get_mut(rule.chain.as_ref())
                .ok_or_else(|| format!("rule for missing chain {}", rule.chain))?
                .rules
                .push(statements);
        }
        NfCmd::Add(NfListObject::Set(set)) => {
            let table = table_mut(tables, &set.table)?;
            table.sets.entry(set.name.to_string()).or_default();
        }
        NfCmd::Add(NfListObject::Map(map)) => {
            let table = table_mut(tables, &map.table)?;
            table.sets.entry(map.name.to_string()).or_insert(FakeSet {
                map: true,
                elements: BTreeMap::new(),
            });
        }
        NfCmd::Delete(NfListObject::Map(map)) => {
            let table = table_mut(tables, &map.table)?;
            match table.sets.remove(map.name.as_ref()) {
                Some(held) if held.map => {}
                _ => return Err(format!("delete of missing map {}", map.name)),
            }
            if referenced(table, None, Some(&map.name)) {
                return Err(format!("delete of map {} still in use", map.name));
            }
        }
        NfCmd::Delete(NfListObject::Set(set)) => {
            let table = table_mut(tables, &set.table)?;
            table
                .sets
                .remove(set.name.as_ref())
                .ok_or_else(|| format!("delete of missing set {}", set.name))?;
            if referenced(table, None, Some(&set.name)) {
                return Err(format!("delete of set {} still in use", set.name));
            }
        }
        NfCmd::Add(NfListObject::Element(element)) => {
            let table = table_mut(tables, &element.table)?;
            let chains: BTreeSet<String> = table.chains.keys().cloned().collect();
            let set = table
                .sets
                .get_mut(element.name.as_ref())
                .ok_or_else(|| format!("element for missing set {}", element.name))?;
            for item in element.elem.iter() {
                let (key, value) = match (set.map, item) {
                    (true, Expression::List(pair)) if pair.len() == 2 => {
                        if let Expression::Verdict(Verdict::Goto(target)) = &pair[1]
                            && !chains.contains(target.target.as_ref())
                        {
                            return Err(format!("element goes to missing chain {}", target.target));
                        }
                        (json(&pair[0]).to_string(), Some(json(&pair[1])))
                    }
                    (true, _) => {
                        return Err(format!("map {} element without a value", element.name));
                    }
                    (false, item) => {
                        if !plain_key(item) {
                            return Err(format!("set {} element is not a key", element.name));
                        }
                        (json(item).to_string(), None)
                    }
                };
                match set.elements.get(&key) {
                    Some(held) if *held != value => {
                        return Err(format!(
                            "element {key} exists in {} with another value",
                            element.name
                        ));
                    }
                    _ => {
                        set.elements.insert(key, value);
                    }
                }
            }
        }
        NfCmd::Delete(NfListObject::Element(element)) => {
            let table = table_mut(tables, &element.table)?;
            let set = table
                .sets
                .get_mut(element.name.as_ref())
                .ok_or_else(|| format!("element delete in missing set {}", element.name))?;
            for item in element.elem.iter() {
                let key = json(item).to_string();
                set.elements.remove(&key).ok_or_else(|| {
                    format!("delete of missing element {key} in {}", element.name)
                })?;
            }
        }
        other => return Err(format!("the fake does not model {other:?}")),
    }
    Ok(())
}

fn plain_key(item: &Expression<'_>) -> bool {
    matches!(
        item,
        Expression::String(_)
            | Expression::Number(_)
            | Expression::Named(NamedExpression::Concat(_))
    )
}
