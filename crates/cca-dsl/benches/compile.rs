//! Benchmark: parse and compile a generated file of 10,000 services (the
//! target is under 200 ms), plus formatting the same file.
//! Run with `cargo bench -p cca-dsl --bench compile`.

use std::fmt::Write;
use std::hint::black_box;

use cca_dsl::compile::compile_str;
use cca_dsl::diagnostic::codes;
use cca_dsl::format::format_source;
use cca_dsl::template::Values;
use criterion::{Criterion, criterion_group, criterion_main};

/// A program with `count` services (health, resources, env, tags,
/// placement) plus a shared secret, a connection and one gate per hundred.
fn generated_program(count: usize) -> String {
    let mut text = String::with_capacity(count * 400);
    text.push_str("secret db_password\n\nconnection app_db {\n  driver = \"postgresql\"\n  secret = db_password\n  host = \"svc-0\"\n}\n\n");
    for index in 0..count {
        let neighbour = (index + 1) % count;
        let _ = write!(
            text,
            "service svc-{index} {{\n  image = \"registry.local/app:{index}\"\n  replicas = 3\n  port http 8080\n  connection app_db\n\n  env {{\n    INDEX = \"{index}\"\n  }}\n\n  resources {{\n    cpu = 250m\n    memory = 256Mi\n  }}\n\n  health {{\n    http \"/health\" port http\n    interval = 10s\n  }}\n\n  placement {{\n    separate svc-{neighbour}\n  }}\n\n  tags {{\n    team = \"t{}\"\n  }}\n}}\n\n",
            index % 10
        );
        if index % 100 == 0 {
            let _ = write!(
                text,
                "gate g{index} {{\n  host \"g{index}.example.com\"\n  service svc-{index} port http\n}}\n\n"
            );
        }
    }
    text
}

fn bench_compile(c: &mut Criterion) {
    let text = generated_program(10_000);
    let values = Values::default();
    let check = compile_str(&text, &values);
    // Gates warn that they are not enforced yet; nothing else may.
    assert!(
        check
            .diagnostics
            .iter()
            .all(|d| d.code == codes::NOT_ENFORCED),
        "generated program is clean"
    );
    assert_eq!(check.program.services.len(), 10_000);
    let mut group = c.benchmark_group("dsl");
    group.sample_size(20);
    group.bench_function("parse_and_compile_10k_services", |b| {
        // The caller keeps the compilation: freeing it is not compiling.
        b.iter_with_large_drop(|| compile_str(black_box(&text), &values));
    });
    group.bench_function("parse_only", |b| {
        b.iter(|| cca_dsl::parse(black_box(&text)));
    });
    group.bench_function("lex_only", |b| {
        b.iter(|| cca_dsl::syntax::lex(black_box(&text)));
    });
    group.bench_function("format_10k_services", |b| {
        b.iter(|| format_source(black_box(&text)));
    });
    group.finish();
}

criterion_group!(benches, bench_compile);
criterion_main!(benches);
