//! Answers within a token budget: an assistant pays for every token a
//! tool returns, so no answer may grow with the cluster. Lists come in
//! pages that stop at the budget (or a caller's limit) with a cursor for
//! the rest; a single object that is over the budget has its longest
//! lists cut, each cut said in the object, before whole fields go.
//!
//! Tokens are estimated from the answer's JSON text at
//! [`BYTES_PER_TOKEN`] bytes a token, about what tokenizers make of JSON
//! with English names; the estimate errs long for numbers and punctuation.

use serde::Serialize;
use serde_json::{Map, Value};

/// The budget of an answer when the server is not told otherwise.
pub const DEFAULT_TOKEN_BUDGET: usize = 8_000;

/// The smallest budget a server takes: below it not even a page's frame
/// and one row fit.
pub const MIN_TOKEN_BUDGET: usize = 500;

/// Bytes of JSON a token, for the estimate.
pub const BYTES_PER_TOKEN: usize = 4;

/// What a page's frame (counts, cursor, note) takes at most.
const FRAME_TOKENS: usize = 120;

/// The estimated tokens of `value` as the answer's JSON text.
pub fn tokens(value: &impl Serialize) -> usize {
    serde_json::to_string(value)
        .map_or(0, |text| text.len())
        .div_ceil(BYTES_PER_TOKEN)
}

/// Where a page starts: the `next_cursor` of the page before (an offset
/// into the list, which is sorted the same way on every call).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cursor(pub usize);

impl Cursor {
    /// Reads a cursor this server gave; `None` is the first page.
    pub fn parse(text: Option<&str>) -> Result<Cursor, String> {
        let Some(text) = text else {
            return Ok(Cursor(0));
        };
        text.strip_prefix('@')
            .and_then(|offset| offset.parse().ok())
            .map(Cursor)
            .ok_or_else(|| {
                format!(
                    "cursor \"{text}\" is not one this server gives: pass the `next_cursor` of \
                     the previous answer, or none for the first page"
                )
            })
    }

    fn text(self) -> String {
        format!("@{}", self.0)
    }
}

/// One page of a list.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Page {
    /// Rows in the whole list.
    pub total: usize,
    /// The first row's place in the list (0-based).
    pub offset: usize,
    pub items: Vec<Value>,
    /// Pass it as `cursor` for the rows after these; absent on the last
    /// page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    /// Why the page stopped before the list's end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The page of `rows` from `cursor`: at most `limit` rows (all when
/// `None`) and no more than fit in `budget` tokens with the page's frame
/// and `header` (what the answer carries besides the page). A row that is
/// over the budget on its own is replaced by a stub saying so, so a page
/// always moves on.
pub fn page(
    rows: Vec<Value>,
    cursor: Cursor,
    limit: Option<usize>,
    budget: usize,
    header: usize,
) -> Result<Page, String> {
    let total = rows.len();
    if cursor.0 > total {
        return Err(format!(
            "cursor \"{}\" is past the end of the list ({total} rows now): start again without one",
            cursor.text()
        ));
    }
    let room = budget.saturating_sub(FRAME_TOKENS + header);
    let limit = limit.unwrap_or(usize::MAX).max(1);
    let (mut items, mut used) = (Vec::new(), 0);
    let mut stopped_by_budget = false;
    for (index, row) in rows.into_iter().enumerate().skip(cursor.0) {
        if items.len() == limit {
            break;
        }
        // A comma between rows.
        let cost = tokens(&row) + 1;
        if used + cost > room {
            if items.is_empty() {
                items.push(oversized(index, cost));
                used += 1;
                continue;
            }
            stopped_by_budget = true;
            break;
        }
        used += cost;
        items.push(row);
    }
    let end = cursor.0 + items.len();
    let more = end < total;
    Ok(Page {
        total,
        offset: cursor.0,
        note: (more && stopped_by_budget).then(|| {
            format!(
                "{} of {total} rows fit in this answer's token budget; pass next_cursor for more",
                items.len()
            )
        }),
        items,
        next_cursor: more.then(|| Cursor(end).text()),
    })
}

/// The stub of a row over the budget on its own.
fn oversized(index: usize, cost: usize) -> Value {
    serde_json::json!({
        "omitted": format!(
            "row {index} alone is about {cost} tokens, over this answer's budget; \
             ask for it with its describe tool"
        )
    })
}

/// `value` made to fit in `budget` tokens: while it is over, its longest
/// top-level list loses rows from its end (`{field}_omitted` says how
/// many); when no list is left to cut, the largest fields go whole
/// (`omitted_fields` names them).
pub fn fit(value: Value, budget: usize) -> Value {
    let Value::Object(mut object) = value else {
        return value;
    };
    while tokens(&object) > budget {
        if !cut_longest_list(&mut object, budget) && !drop_largest_field(&mut object) {
            break;
        }
    }
    Value::Object(object)
}

/// Halves (at least by one row) the longest list of `object`; false when
/// no list has rows.
fn cut_longest_list(object: &mut Map<String, Value>, budget: usize) -> bool {
    let longest = object
        .iter()
        .filter_map(|(field, value)| Some((field.clone(), tokens(value.as_array()?))))
        .filter(|(_, size)| *size > 1)
        .max_by_key(|(_, size)| *size);
    let Some((field, _)) = longest else {
        return false;
    };
    let over = tokens(object).saturating_sub(budget);
    let Some(Value::Array(rows)) = object.get_mut(&field) else {
        return false;
    };
    // Cut what is over, at least one row and at most half at a time (rows
    // differ in size).
    let per_row = (tokens(rows) / rows.len().max(1)).max(1);
    let cut = over.div_ceil(per_row).clamp(1, rows.len().div_ceil(2));
    let keep = rows.len() - cut;
    rows.truncate(keep);
    let counter = format!("{field}_omitted");
    let before = object.get(&counter).and_then(Value::as_u64).unwrap_or(0);
    object.insert(counter, Value::from(before + cut as u64));
    true
}

/// Removes the largest field of `object` (never `omitted_fields` itself);
/// false when there is none.
fn drop_largest_field(object: &mut Map<String, Value>) -> bool {
    let largest = object
        .iter()
        .filter(|(field, _)| *field != "omitted_fields")
        .max_by_key(|(_, value)| tokens(value))
        .map(|(field, _)| field.clone());
    let Some(field) = largest else {
        return false;
    };
    object.remove(&field);
    let omitted = object
        .entry("omitted_fields")
        .or_insert_with(|| Value::Array(Vec::new()));
    if let Value::Array(names) = omitted {
        names.push(Value::String(field));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rows(count: usize) -> Vec<Value> {
        (0..count)
            .map(|i| json!({"name": format!("service-{i:04}"), "replicas": 3}))
            .collect()
    }

    #[test]
    fn pages_stop_at_the_budget_and_the_cursors_cover_the_list_once() {
        let all = rows(500);
        let (mut seen, mut cursor, mut pages) = (Vec::new(), Cursor(0), 0);
        loop {
            let page = page(all.clone(), cursor, None, 1_000, 0).expect("a page");
            assert!(tokens(&page) <= 1_000, "{} tokens", tokens(&page));
            assert_eq!(page.offset, cursor.0);
            seen.extend(page.items.clone());
            pages += 1;
            match page.next_cursor {
                Some(next) => {
                    assert!(page.note.is_some(), "a cut page says why");
                    cursor = Cursor::parse(Some(&next)).expect("ours");
                }
                None => break,
            }
        }
        assert_eq!(seen, all);
        assert!(pages > 5, "{pages} pages");
    }

    #[test]
    fn a_limit_ends_a_page_before_the_budget_does() {
        let page = page(rows(50), Cursor(10), Some(5), DEFAULT_TOKEN_BUDGET, 0).expect("a page");
        assert_eq!(page.items, rows(50)[10..15]);
        assert_eq!(page.next_cursor.as_deref(), Some("@15"));
        assert_eq!(page.note, None, "the caller's limit, not the budget");
        let last = super::page(rows(50), Cursor(45), Some(10), DEFAULT_TOKEN_BUDGET, 0).expect("");
        assert_eq!((last.items.len(), last.next_cursor), (5, None));
    }

    #[test]
    fn a_row_over_the_budget_alone_becomes_a_stub_and_the_page_moves_on() {
        let huge = json!({"spec": "x".repeat(20_000)});
        let page = page(
            vec![huge, json!({"name": "small"})],
            Cursor(0),
            None,
            600,
            0,
        )
        .expect("");
        assert!(
            page.items[0]["omitted"]
                .as_str()
                .expect("stub")
                .contains("row 0")
        );
        assert_eq!(page.items[1], json!({"name": "small"}));
        assert!(tokens(&page) <= 600);
    }

    #[test]
    fn cursors_are_checked() {
        assert_eq!(Cursor::parse(None), Ok(Cursor(0)));
        assert_eq!(Cursor::parse(Some("@12")), Ok(Cursor(12)));
        for bad in ["12", "@", "@x", "@-1"] {
            let error = Cursor::parse(Some(bad)).expect_err(bad);
            assert!(
                error.contains(bad) && error.contains("next_cursor"),
                "{error}"
            );
        }
        let past = page(rows(3), Cursor(7), None, DEFAULT_TOKEN_BUDGET, 0).expect_err("past");
        assert!(
            past.contains("past the end") && past.contains("3 rows"),
            "{past}"
        );
    }

    #[test]
    fn fit_cuts_the_longest_lists_and_says_so() {
        let detail = json!({
            "summary": {"name": "web", "replicas": 200},
            "instances": rows(400),
            "events": rows(40),
        });
        let fitted = fit(detail, 1_000);
        assert!(tokens(&fitted) <= 1_000, "{}", tokens(&fitted));
        assert_eq!(fitted["summary"]["name"], "web", "small fields stay");
        let kept = fitted["instances"].as_array().expect("list").len();
        let omitted = fitted["instances_omitted"].as_u64().expect("said");
        assert_eq!(kept + omitted as usize, 400);
        assert!(kept > 0);
    }

    #[test]
    fn fit_drops_whole_fields_when_no_list_is_left() {
        let detail = json!({"name": "web", "spec": "y".repeat(50_000)});
        let fitted = fit(detail, 600);
        assert_eq!(fitted["name"], "web");
        assert_eq!(fitted["omitted_fields"], json!(["spec"]));
        let small = json!({"name": "web"});
        assert_eq!(fit(small.clone(), 600), small);
    }
}
