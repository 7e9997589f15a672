//! Property tests: generated programs written in random layouts (with or
//! without `=`, `;` or newlines, comments, odd indentation) compile to the
//! same facts before and after `cca fmt`; formatting is idempotent and
//! keeps the tree; arbitrary token soup never breaks the parser.

use cca_dsl::compile::compile_str;
use cca_dsl::format::format_source;
use cca_dsl::parse;
use cca_dsl::template::Values;
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Service {
    image: bool,
    replicas: u32,
    ports: Vec<(Option<String>, u16)>,
    env: Vec<(String, String)>,
    cpu: Option<u32>,
    tags: Vec<(String, String)>,
    stateful: bool,
}

#[derive(Debug, Clone)]
struct Layout {
    equals: bool,
    semicolons: bool,
    comments: bool,
    indent: usize,
    blank_lines: bool,
}

fn service() -> impl Strategy<Value = Service> {
    (
        any::<bool>(),
        0u32..50,
        prop::collection::btree_map(1u16..=65535, any::<bool>(), 0..4),
        prop::collection::btree_map("[A-Z][A-Z_]{0,6}", "[ -~&&[^\"\\\\{}]]{0,12}", 0..3),
        prop::option::of(1u32..4000),
        prop::collection::btree_map("[a-z]{1,6}", "[a-z0-9]{0,6}", 0..3),
        any::<bool>(),
    )
        .prop_map(
            |(image, replicas, ports, env, cpu, tags, stateful)| Service {
                image,
                replicas,
                ports: ports
                    .into_iter()
                    .enumerate()
                    .map(|(i, (number, named))| (named.then(|| format!("p{i}")), number))
                    .collect(),
                env: env.into_iter().collect(),
                cpu,
                tags: tags.into_iter().collect(),
                stateful,
            },
        )
}

fn layout() -> impl Strategy<Value = Layout> {
    (
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        0usize..5,
        any::<bool>(),
    )
        .prop_map(
            |(equals, semicolons, comments, indent, blank_lines)| Layout {
                equals,
                semicolons,
                comments,
                indent,
                blank_lines,
            },
        )
}

/// Writes one service in the given layout.
fn write_service(out: &mut String, index: usize, service: &Service, layout: &Layout) {
    let pad = " ".repeat(layout.indent);
    let eq = if layout.equals { " = " } else { " " };
    let end = if layout.semicolons { "; " } else { "\n" };
    if layout.comments {
        out.push_str(&format!("# service {index}\n"));
    }
    out.push_str(&format!("service svc-{index} {{{end}"));
    let mut line = |text: String| {
        out.push_str(&pad);
        out.push_str(&text);
        if layout.comments && !layout.semicolons {
            out.push_str(" # note");
        }
        out.push_str(end);
    };
    if service.image {
        line(format!("image{eq}\"registry.local/app:{index}\""));
    } else {
        line(format!("run{eq}\"serve --port $PORT\""));
    }
    line(format!("replicas{eq}{}", service.replicas));
    for (name, number) in &service.ports {
        match name {
            Some(name) => line(format!("port {name} {number}")),
            None => line(format!("port {number}")),
        }
    }
    if !service.env.is_empty() {
        let pairs: Vec<String> = service
            .env
            .iter()
            .map(|(k, v)| format!("{k}{eq}\"{v}\""))
            .collect();
        line(format!("env {{ {} }}", pairs.join("; ")));
    }
    if let Some(cpu) = service.cpu {
        line(format!("resources {{ cpu{eq}{cpu}m }}"));
    }
    if !service.tags.is_empty() {
        let pairs: Vec<String> = service
            .tags
            .iter()
            .map(|(k, v)| format!("{k} = \"{v}\""))
            .collect();
        line(format!("tags {{ {} }}", pairs.join("; ")));
    }
    if service.stateful {
        line("stateful".to_owned());
    }
    out.push('}');
    out.push('\n');
    if layout.blank_lines {
        out.push('\n');
    }
}

fn program() -> impl Strategy<Value = String> {
    prop::collection::vec((service(), layout()), 0..6).prop_map(|services| {
        let mut out = String::new();
        for (index, (service, layout)) in services.iter().enumerate() {
            write_service(&mut out, index, service, layout);
        }
        out
    })
}

fn facts(text: &str) -> Vec<(String, Vec<u8>)> {
    let compiled = compile_str(text, &Values::default());
    let errors: Vec<&str> = compiled
        .diagnostics
        .iter()
        .filter(|d| d.is_error())
        .map(|d| d.message.as_str())
        .collect();
    assert!(errors.is_empty(), "{errors:?} in\n{text}");
    compiled
        .program
        .facts()
        .expect("encodes")
        .into_iter()
        .map(|fact| (fact.key, fact.value))
        .collect()
}

proptest! {
    #[test]
    fn formatting_preserves_the_facts(text in program()) {
        let before = facts(&text);
        let formatted = format_source(&text).expect("generated programs parse");
        prop_assert_eq!(facts(&formatted), before);
        prop_assert_eq!(format_source(&formatted).expect("parses"), formatted.clone());
        prop_assert_eq!(parse(&text).root.shape(&text), parse(&formatted).root.shape(&formatted));
    }

    #[test]
    fn compiling_twice_gives_identical_bytes(text in program()) {
        prop_assert_eq!(facts(&text), facts(&text));
    }

    #[test]
    fn token_soup_never_breaks_the_parser(text in "[a-z0-9 {}\\[\\]=\"#\n;,*>%-]{0,300}") {
        let parsed = parse(&text);
        prop_assert_eq!(parsed.root.text(&text), text.clone());
        let _ = compile_str(&text, &Values::default());
        if let Ok(formatted) = format_source(&text) {
            prop_assert_eq!(format_source(&formatted).expect("parses"), formatted.clone());
            prop_assert_eq!(parse(&text).root.shape(&text), parse(&formatted).root.shape(&formatted));
        }
    }
}
