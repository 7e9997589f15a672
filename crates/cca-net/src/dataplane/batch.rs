//! [`Batch`]: one nftables transaction, as typed commands of the
//! `nftables` crate's JSON schema, applied with `nft -j -f -` (every
//! command of a batch or none). The schema cannot spell one thing the data
//! plane needs — a map whose data are verdicts (`"map": "verdict"`) — so
//! [`Command`] adds that one declaration as a typed struct of its own; no
//! rule text is ever built from strings.
//!
//! The builders below are the vocabulary the compiler writes rules in:
//! [`Batch`]'s methods for commands, the free functions for expressions
//! and statements.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use nftables::expr::{
    CT, CTDir, Expression, Fib, FibFlag, FibResult, JHash, Map as ExprMap, Meta, MetaKey,
    NamedExpression, NgMode, Numgen, Payload, PayloadField, SetItem, Verdict,
};
use nftables::schema::{
    Chain, Element, FlushObject, Map, NfCmd, NfListObject, Rule, Set, SetType, SetTypeValue, Table,
};
use nftables::stmt::{
    JumpTarget, Match, NAT, NATFamily, Operator, Reject, RejectType, Statement, VerdictMap,
};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook, RejectCode};
use serde::Serialize;

use cca_model::spec::Protocol;

/// One command of a batch.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Command {
    /// A command the `nftables` crate's schema spells.
    Nft(NfCmd<'static>),
    /// `add map` of a map from `key` to verdicts.
    AddVerdictMap(AddVerdictMap),
}

/// `{"add": {"map": {..., "map": "verdict"}}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AddVerdictMap {
    add: VerdictMapObject,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
struct VerdictMapObject {
    map: VerdictMapDecl,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
struct VerdictMapDecl {
    family: NfFamily,
    table: String,
    name: String,
    #[serde(rename = "type")]
    key: SetTypeValue<'static>,
    map: VerdictData,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
enum VerdictData {
    #[serde(rename = "verdict")]
    Verdict,
}

impl AddVerdictMap {
    /// The table the map is declared in.
    pub fn table(&self) -> &str {
        &self.add.map.table
    }

    /// The map's name.
    pub fn name(&self) -> &str {
        &self.add.map.name
    }
}

/// One atomic nftables transaction on one `ip` table.
///
/// Element additions are gathered per set and go last, in one command per
/// set: every chain a verdict element names and every set exists by then,
/// an element deleted and added again (a VIP moving between services)
/// is deleted first, and a full rebuild adds each set's elements in one
/// command instead of one per service.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    commands: Vec<Command>,
    adds: BTreeMap<String, Vec<Expression<'static>>>,
    table: String,
}

impl Serialize for Batch {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Document<'a> {
            nftables: &'a [Command],
        }
        Document {
            nftables: &self.commands(),
        }
        .serialize(serializer)
    }
}

/// A base chain's hook: the chain type, hook and priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hook {
    pub kind: NfChainType,
    pub hook: NfHook,
    pub priority: i32,
}

impl Batch {
    /// An empty batch for `table` (family `ip`).
    pub fn new(table: &str) -> Batch {
        Batch {
            table: table.to_owned(),
            ..Batch::default()
        }
    }

    /// The table every command is for.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The commands, in the order `nft` applies them.
    pub fn commands(&self) -> Vec<Command> {
        let mut commands = self.commands.clone();
        for (set, elements) in &self.adds {
            if let Some(element) = self.element(set, elements.clone()) {
                commands.push(Command::Nft(NfCmd::Add(NfListObject::Element(element))));
            }
        }
        commands
    }

    pub fn len(&self) -> usize {
        self.commands.len() + self.adds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.commands.is_empty() && self.adds.is_empty()
    }

    /// The JSON `nft -j -f -` reads.
    pub fn to_json(&self) -> String {
        // Every field is a plain string, number or enum: serializing
        // cannot fail, and an empty batch is the harmless fallback.
        serde_json::to_string(self).unwrap_or_else(|_| String::from(r#"{"nftables":[]}"#))
    }

    fn push(&mut self, command: NfCmd<'static>) {
        self.commands.push(Command::Nft(command));
    }

    fn table_object(&self) -> Table<'static> {
        Table {
            family: NfFamily::IP,
            name: Cow::Owned(self.table.clone()),
            handle: None,
        }
    }

    fn chain_object(&self, name: &str, hook: Option<Hook>) -> Chain<'static> {
        Chain {
            family: NfFamily::IP,
            table: Cow::Owned(self.table.clone()),
            name: Cow::Owned(name.to_owned()),
            newname: None,
            handle: None,
            _type: hook.map(|h| h.kind),
            hook: hook.map(|h| h.hook),
            prio: hook.map(|h| h.priority),
            dev: None,
            policy: hook.map(|_| NfChainPolicy::Accept),
        }
    }

    pub(crate) fn add_table(&mut self) {
        let table = self.table_object();
        self.push(NfCmd::Add(NfListObject::Table(table)));
    }

    pub(crate) fn delete_table(&mut self) {
        let table = self.table_object();
        self.push(NfCmd::Delete(NfListObject::Table(table)));
    }

    pub(crate) fn add_chain(&mut self, name: &str, hook: Option<Hook>) {
        let chain = self.chain_object(name, hook);
        self.push(NfCmd::Add(NfListObject::Chain(chain)));
    }

    pub(crate) fn flush_chain(&mut self, name: &str) {
        let chain = self.chain_object(name, None);
        self.push(NfCmd::Flush(FlushObject::Chain(chain)));
    }

    pub(crate) fn delete_chain(&mut self, name: &str) {
        let chain = self.chain_object(name, None);
        self.push(NfCmd::Delete(NfListObject::Chain(chain)));
    }

    pub(crate) fn add_rule(&mut self, chain: &str, statements: Vec<Statement<'static>>) {
        let rule = Rule {
            family: NfFamily::IP,
            table: Cow::Owned(self.table.clone()),
            chain: Cow::Owned(chain.to_owned()),
            expr: Cow::Owned(statements),
            handle: None,
            index: None,
            comment: None,
        };
        self.push(NfCmd::Add(NfListObject::Rule(rule)));
    }

    pub(crate) fn add_set(&mut self, name: &str, key: &[SetType]) {
        let set = Set {
            family: NfFamily::IP,
            table: Cow::Owned(self.table.clone()),
            name: Cow::Owned(name.to_owned()),
            handle: None,
            set_type: set_type(key),
            policy: None,
            flags: None,
            elem: None,
            timeout: None,
            gc_interval: None,
            size: None,
            comment: None,
        };
        self.push(NfCmd::Add(NfListObject::Set(Box::new(set))));
    }

    /// Deletes a set, and the additions to it this batch still held.
    pub(crate) fn delete_set(&mut self, name: &str) {
        self.adds.remove(name);
        let set = Set {
            family: NfFamily::IP,
            table: Cow::Owned(self.table.clone()),
            name: Cow::Owned(name.to_owned()),
            handle: None,
            set_type: SetTypeValue::Single(SetType::Ipv4Addr),
            policy: None,
            flags: None,
            elem: None,
            timeout: None,
            gc_interval: None,
            size: None,
            comment: None,
        };
        self.push(NfCmd::Delete(NfListObject::Set(Box::new(set))));
    }

    /// Declares a map from `key` to `data` (one type: nft 1.0.6's JSON
    /// cannot declare a map to a concatenation).
    pub(crate) fn add_map(&mut self, name: &str, key: &[SetType], data: SetType) {
        let map = self.map_object(name, key, data);
        self.push(NfCmd::Add(NfListObject::Map(Box::new(map))));
    }

    /// Deletes a map, and the additions to it this batch still held.
    pub(crate) fn delete_map(&mut self, name: &str) {
        self.adds.remove(name);
        let map = self.map_object(name, &[SetType::Ipv4Addr], SetType::Ipv4Addr);
        self.push(NfCmd::Delete(NfListObject::Map(Box::new(map))));
    }

    fn map_object(&self, name: &str, key: &[SetType], data: SetType) -> Map<'static> {
        Map {
            family: NfFamily::IP,
            table: Cow::Owned(self.table.clone()),
            name: Cow::Owned(name.to_owned()),
            handle: None,
            set_type: set_type(key),
            map: SetTypeValue::Single(data),
            policy: None,
            flags: None,
            elem: None,
            timeout: None,
            gc_interval: None,
            size: None,
            comment: None,
        }
    }

    pub(crate) fn add_verdict_map(&mut self, name: &str, key: &[SetType]) {
        self.commands.push(Command::AddVerdictMap(AddVerdictMap {
            add: VerdictMapObject {
                map: VerdictMapDecl {
                    family: NfFamily::IP,
                    table: self.table.clone(),
                    name: name.to_owned(),
                    key: set_type(key),
                    map: VerdictData::Verdict,
                },
            },
        }));
    }

    /// Adds `elements` to a set, or `[key, value]` lists to a map, at the
    /// end of the batch; nothing when `elements` is empty.
    pub(crate) fn add_elements(&mut self, set: &str, elements: Vec<Expression<'static>>) {
        if !elements.is_empty() {
            self.adds
                .entry(set.to_owned())
                .or_default()
                .extend(elements);
        }
    }

    /// Deletes `elements` (keys, for a map); nothing when empty.
    pub(crate) fn delete_elements(&mut self, set: &str, elements: Vec<Expression<'static>>) {
        if let Some(element) = self.element(set, elements) {
            self.push(NfCmd::Delete(NfListObject::Element(element)));
        }
    }

    fn element(&self, set: &str, elements: Vec<Expression<'static>>) -> Option<Element<'static>> {
        (!elements.is_empty()).then(|| Element {
            family: NfFamily::IP,
            table: Cow::Owned(self.table.clone()),
            name: Cow::Owned(set.to_owned()),
            elem: Cow::Owned(elements),
        })
    }
}

fn set_type(key: &[SetType]) -> SetTypeValue<'static> {
    match key {
        [single] => SetTypeValue::Single(*single),
        many => SetTypeValue::Concatenated(Cow::Owned(many.to_vec())),
    }
}

// Expressions.

pub(crate) fn string(text: impl Into<String>) -> Expression<'static> {
    Expression::String(Cow::Owned(text.into()))
}

pub(crate) fn address(address: Ipv4Addr) -> Expression<'static> {
    string(address.to_string())
}

pub(crate) fn number(value: u32) -> Expression<'static> {
    Expression::Number(value)
}

/// `@name`: a reference to a named set or map.
pub(crate) fn set_ref(name: &str) -> Expression<'static> {
    string(format!("@{name}"))
}

pub(crate) fn concat(parts: Vec<Expression<'static>>) -> Expression<'static> {
    Expression::Named(NamedExpression::Concat(parts))
}

/// An anonymous set `{ a, b }`.
pub(crate) fn anonymous_set(items: Vec<Expression<'static>>) -> Expression<'static> {
    Expression::Named(NamedExpression::Set(
        items.into_iter().map(SetItem::Element).collect(),
    ))
}

/// A map element: `key : value`.
pub(crate) fn mapping(key: Expression<'static>, value: Expression<'static>) -> Expression<'static> {
    Expression::List(vec![key, value])
}

pub(crate) fn goto_verdict(chain: &str) -> Expression<'static> {
    Expression::Verdict(Verdict::Goto(JumpTarget {
        target: Cow::Owned(chain.to_owned()),
    }))
}

pub(crate) fn payload(protocol: &'static str, field: &'static str) -> Expression<'static> {
    Expression::Named(NamedExpression::Payload(Payload::PayloadField(
        PayloadField {
            protocol: Cow::Borrowed(protocol),
            field: Cow::Borrowed(field),
        },
    )))
}

pub(crate) fn meta(key: MetaKey) -> Expression<'static> {
    Expression::Named(NamedExpression::Meta(Meta { key }))
}

pub(crate) fn ct(key: &'static str, dir: Option<CTDir>) -> Expression<'static> {
    Expression::Named(NamedExpression::CT(CT {
        key: Cow::Borrowed(key),
        family: None,
        dir,
    }))
}

/// `fib saddr type`: the kind of address the source is on this node.
pub(crate) fn fib_saddr_type() -> Expression<'static> {
    Expression::Named(NamedExpression::Fib(Fib {
        result: FibResult::Type,
        flags: [FibFlag::Saddr].into_iter().collect(),
    }))
}

/// `numgen random mod {modulus}`.
pub(crate) fn random(modulus: u32) -> Expression<'static> {
    Expression::Named(NamedExpression::Numgen(Numgen {
        mode: NgMode::Random,
        ng_mod: modulus,
        offset: None,
    }))
}

/// `jhash ip saddr mod {modulus} seed {seed}`.
pub(crate) fn source_hash(modulus: u32, seed: u32) -> Expression<'static> {
    Expression::Named(NamedExpression::JHash(JHash {
        hash_mod: modulus,
        offset: None,
        expr: Box::new(payload("ip", "saddr")),
        seed: Some(seed),
    }))
}

pub(crate) fn protocol_name(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
    }
}

// Statements.

pub(crate) fn matches(
    left: Expression<'static>,
    op: Operator,
    right: Expression<'static>,
) -> Statement<'static> {
    Statement::Match(Match { left, right, op })
}

pub(crate) fn equals(left: Expression<'static>, right: Expression<'static>) -> Statement<'static> {
    matches(left, Operator::EQ, right)
}

/// `meta l4proto {protocol}`.
pub(crate) fn l4proto(protocol: Protocol) -> Statement<'static> {
    equals(meta(MetaKey::L4proto), string(protocol_name(protocol)))
}

pub(crate) fn jump(chain: &str) -> Statement<'static> {
    Statement::Jump(JumpTarget {
        target: Cow::Owned(chain.to_owned()),
    })
}

pub(crate) fn goto(chain: &str) -> Statement<'static> {
    Statement::Goto(JumpTarget {
        target: Cow::Owned(chain.to_owned()),
    })
}

pub(crate) fn accept() -> Statement<'static> {
    Statement::Accept(None)
}

/// `{key} map @{map}`: the value `key` maps to in a named map.
pub(crate) fn lookup(key: Expression<'static>, map: &str) -> Expression<'static> {
    Expression::Named(NamedExpression::Map(Box::new(ExprMap {
        key,
        data: set_ref(map),
    })))
}

/// `dnat ip to {address}:{port}`, both expressions (map lookups).
pub(crate) fn dnat(address: Expression<'static>, port: Expression<'static>) -> Statement<'static> {
    Statement::DNAT(Some(NAT {
        addr: Some(address),
        family: Some(NATFamily::IP),
        port: Some(port),
        flags: None,
    }))
}

/// `{key} vmap @{map}`.
pub(crate) fn vmap(key: Expression<'static>, map: &str) -> Statement<'static> {
    Statement::VerdictMap(VerdictMap {
        key,
        data: set_ref(map),
    })
}

/// `{key} vmap { 0 : goto a, 1 : goto b, … }`: an anonymous verdict map.
pub(crate) fn vmap_goto(key: Expression<'static>, chains: &[String]) -> Statement<'static> {
    let items = chains
        .iter()
        .enumerate()
        .map(|(i, chain)| SetItem::Mapping(number(i as u32), goto_verdict(chain)))
        .collect();
    Statement::VerdictMap(VerdictMap {
        key,
        data: Expression::Named(NamedExpression::Set(items)),
    })
}

pub(crate) fn masquerade() -> Statement<'static> {
    Statement::Masquerade(None)
}

/// `reject with tcp reset`.
pub(crate) fn reset() -> Statement<'static> {
    Statement::Reject(Some(Reject::new(Some(RejectType::TCPReset), None)))
}

/// `reject with icmp type port-unreachable`.
pub(crate) fn port_unreachable() -> Statement<'static> {
    Statement::Reject(Some(Reject::new(
        Some(RejectType::ICMP),
        Some(RejectCode::PortUnreach),
    )))
}
