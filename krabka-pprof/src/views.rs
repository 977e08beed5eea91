//! Every view of the profiling routes, pure functions that know nothing of HTTP:
//! [`render`] turns a decoded `crate::profile::proto::Profile` into the `?format=` asked for (the
//! gzipped pprof that `go tool pprof` and scrapers read, the text top table with
//! `go tool pprof -top`'s columns, or the flamegraph SVG drawn by inferno, the engine
//! behind the `pprof` crate's and jemalloc_pprof's flamegraphs), shared by the CPU and
//! heap routes and the thread dump. It knows no sampler and no HTTP.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;

use crate::profile::Profile;

/// The `?format=` views of a profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    /// Gzipped pprof protobuf, what `go tool pprof` and the scrapers read.
    Pprof,
    /// A flamegraph, SVG.
    #[cfg_attr(not(feature = "flamegraph"), allow(dead_code))]
    Svg,
    /// A `go tool pprof -top`-style table.
    Text,
}

impl Format {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Format::Pprof => "pprof",
            Format::Svg => "svg",
            Format::Text => "text",
        }
    }
}

/// A rendered view, ready to send, and how many samples it holds.
pub(crate) struct View {
    pub(crate) body: ViewBody,
    pub(crate) samples: i64,
}

pub(crate) enum ViewBody {
    Pprof(Vec<u8>),
    #[cfg_attr(not(feature = "flamegraph"), allow(dead_code))]
    Svg(String),
    Text(String),
}

/// Renders `profile` as `format`; runs on the blocking pool. `lines`: the text view lists
/// lines (`function file:line`, as `go tool pprof -top -lines` does) rather than functions;
/// `group`: it groups them by that label's values first.
pub(crate) fn render(
    profile: &Profile,
    format: Format,
    view: (bool, Option<&str>),
    title: &str,
    subtitle: &str,
) -> Result<View, String> {
    render_with(profile, format, view, None, title, subtitle)
}

/// [`render`], the text view and the flamegraph showing the values of `sample_index` (a
/// sample type of the profile, as `go tool pprof -sample_index` picks one) instead of the
/// profile's default; the pprof format carries it as its `default_sample_type`.
pub(crate) fn render_with(
    profile: &Profile,
    format: Format,
    (lines, group): (bool, Option<&str>),
    sample_index: Option<&str>,
    title: &str,
    subtitle: &str,
) -> Result<View, String> {
    let column = match sample_index {
        Some(name) => Some(sample_column(profile, name)?),
        None => None,
    };
    let granularity = if lines {
        Granularity::Lines
    } else {
        Granularity::Functions
    };
    let samples = profile
        .sample
        .iter()
        .map(|s| s.value.first().copied().unwrap_or(0))
        .sum();
    let body = match format {
        Format::Pprof => match (sample_index, column) {
            (Some(name), Some(column)) if value_index(profile) != Some(column) => {
                let mut chosen = profile.clone();
                chosen.default_sample_type = profile.sample_type[column].ty;
                debug_assert_eq!(profile.string(chosen.default_sample_type), name);
                ViewBody::Pprof(gzip_profile(&chosen)?)
            }
            _ => ViewBody::Pprof(gzip_profile(profile)?),
        },
        Format::Text => {
            let column = column.or_else(|| value_index(profile));
            ViewBody::Text(match group {
                Some(key) => grouped_table(profile, key, granularity, column),
                None => top_table_in(profile, TOP_ROWS, granularity, column),
            })
        }
        #[cfg(feature = "flamegraph")]
        Format::Svg => ViewBody::Svg(flamegraph_in(profile, column, title, subtitle)?),
        #[cfg(not(feature = "flamegraph"))]
        Format::Svg => {
            let _ = (title, subtitle);
            return Err("flamegraphs are compiled out".to_owned());
        }
    };
    Ok(View { body, samples })
}

/// The column of the sample type named `name`, or a sentence naming the profile's types.
pub(crate) fn sample_column(profile: &Profile, name: &str) -> Result<usize, String> {
    profile
        .sample_type
        .iter()
        .position(|t| profile.string(t.ty) == name)
        .ok_or_else(|| {
            let types: Vec<&str> = profile
                .sample_type
                .iter()
                .map(|t| profile.string(t.ty))
                .collect();
            format!(
                "`sample_index` must be one of this profile's sample types, {}; found {name:?}",
                types.join(", ")
            )
        })
}

/// Encodes and gzips a profile the way Go serves it (fastest level: the payload is small
/// and the time is better spent elsewhere).
fn gzip_profile(profile: &Profile) -> Result<Vec<u8>, String> {
    use crate::profile::proto::Message as _;
    use std::io::Write as _;
    let encoded = profile.encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(
        Vec::with_capacity(encoded.len() / 2 + 64),
        flate2::Compression::fast(),
    );
    gz.write_all(&encoded)
        .and_then(|()| gz.finish())
        .map_err(|e| format!("could not gzip the profile: {e}"))
}

/// How many functions the text view lists.
pub(crate) const TOP_ROWS: usize = 30;

/// One row of the top table.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TopRow {
    pub(crate) name: String,
    pub(crate) flat: i64,
    pub(crate) cum: i64,
}

/// The value column a view shows: the profile's default sample type if it names one,
/// else the last, as `go tool pprof` does.
fn value_index(profile: &Profile) -> Option<usize> {
    if profile.sample_type.is_empty() {
        return None;
    }
    let wanted = profile.default_sample_type;
    if wanted != 0
        && let Some(i) = profile.sample_type.iter().position(|t| t.ty == wanted)
    {
        return Some(i);
    }
    Some(profile.sample_type.len() - 1)
}

/// What one frame of a view stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Granularity {
    /// A function: `go tool pprof`'s default.
    Functions,
    /// A line of a function, `function file:line`: `go tool pprof -lines`.
    Lines,
}

/// Each sample's stack, leaf first, inlined frames expanded, one frame per function or
/// per line.
pub(crate) fn sample_stacks_by(
    profile: &Profile,
    granularity: Granularity,
) -> impl Iterator<Item = (Vec<Cow<'_, str>>, &[i64])> + '_ {
    let functions: HashMap<u64, (&str, &str)> = profile
        .function
        .iter()
        .map(|f| (f.id, (profile.string(f.name), profile.string(f.filename))))
        .collect();
    let locations: HashMap<u64, Vec<Cow<'_, str>>> = profile
        .location
        .iter()
        .map(|location| {
            let names = if location.line.is_empty() {
                vec![Cow::Borrowed("[unknown]")]
            } else {
                location
                    .line
                    .iter()
                    .map(|line| {
                        let (name, file) = functions
                            .get(&line.function_id)
                            .copied()
                            .unwrap_or(("", ""));
                        let name = if name.is_empty() { "[unknown]" } else { name };
                        match granularity {
                            Granularity::Lines if !file.is_empty() && line.line > 0 => {
                                Cow::Owned(format!("{name} {file}:{}", line.line))
                            }
                            _ => Cow::Borrowed(name),
                        }
                    })
                    .collect()
            };
            (location.id, names)
        })
        .collect();
    profile.sample.iter().map(move |sample| {
        let stack = sample
            .location_id
            .iter()
            .flat_map(|id| locations.get(id).cloned().unwrap_or_default())
            .collect();
        (stack, sample.value.as_slice())
    })
}

/// Flat and cumulative value per function or line, heaviest flat first (then cum, then
/// name).
#[cfg(test)]
pub(crate) fn top_by(profile: &Profile, granularity: Granularity) -> (Vec<TopRow>, i64) {
    top_where(profile, granularity, value_index(profile), &|_| true)
}

/// Flat and cumulative value per function or line of the values in `column`, over the
/// samples `keep` accepts, heaviest flat first (then cum, then name).
fn top_where(
    profile: &Profile,
    granularity: Granularity,
    column: Option<usize>,
    keep: &dyn Fn(&crate::profile::proto::Sample) -> bool,
) -> (Vec<TopRow>, i64) {
    let Some(column) = column else {
        return (Vec::new(), 0);
    };
    let mut rows: HashMap<Cow<'_, str>, (i64, i64)> = HashMap::new();
    let mut total = 0i64;
    let stacks = sample_stacks_by(profile, granularity).zip(&profile.sample);
    for ((stack, values), _) in stacks.filter(|(_, sample)| keep(sample)) {
        let value = values.get(column).copied().unwrap_or(0);
        total += value;
        if let Some(leaf) = stack.first() {
            rows.entry(leaf.clone()).or_default().0 += value;
        }
        let mut seen: Vec<&Cow<'_, str>> = Vec::with_capacity(stack.len());
        for name in &stack {
            if !seen.contains(&name) {
                seen.push(name);
                rows.entry(name.clone()).or_default().1 += value;
            }
        }
    }
    let mut rows: Vec<TopRow> = rows
        .into_iter()
        .map(|(name, (flat, cum))| TopRow {
            name: name.into_owned(),
            flat,
            cum,
        })
        .collect();
    rows.sort_by(|a, b| {
        b.flat
            .cmp(&a.flat)
            .then(b.cum.cmp(&a.cum))
            .then_with(|| a.name.cmp(&b.name))
    });
    (rows, total)
}

/// The unit and the name of `column`.
fn column_names(profile: &Profile, column: Option<usize>) -> (String, String) {
    column
        .map(|i| {
            let column = &profile.sample_type[i];
            (
                profile.string(column.unit).to_owned(),
                profile.string(column.ty).to_owned(),
            )
        })
        .unwrap_or_default()
}

/// The views' first lines: the column shown, the window's length and the total.
fn header(out: &mut String, profile: &Profile, kind: &str, total: i64, unit: &str) {
    let _ = writeln!(out, "Type: {kind}");
    if profile.duration_nanos > 0 {
        let _ = writeln!(
            out,
            "Duration: {}, Total samples = {}",
            format_value(profile.duration_nanos, "nanoseconds"),
            format_value(total, unit),
        );
    }
}

/// The text view: a header like `go tool pprof -top`'s, then flat, flat%, sum%, cum, cum%
/// and the function name for the heaviest `limit` functions.
#[cfg(test)]
pub(crate) fn top_table(profile: &Profile, limit: usize) -> String {
    top_table_by(profile, limit, Granularity::Functions)
}

/// [`top_table`], one row per function or per line.
#[cfg(test)]
pub(crate) fn top_table_by(profile: &Profile, limit: usize, granularity: Granularity) -> String {
    top_table_in(profile, limit, granularity, value_index(profile))
}

/// The text view of the values in `column`: a header like `go tool pprof -top`'s, then
/// flat, flat%, sum%, cum, cum% and the name for the heaviest `limit` functions or lines.
fn top_table_in(
    profile: &Profile,
    limit: usize,
    granularity: Granularity,
    column: Option<usize>,
) -> String {
    let (rows, total) = top_where(profile, granularity, column, &|_| true);
    let (unit, kind) = column_names(profile, column);
    let mut out = String::new();
    header(&mut out, profile, &kind, total, &unit);
    rows_table(&mut out, &rows, total, &unit, limit);
    out
}

/// The text view grouped by the values of label `key` (`?group=`): a table of the value
/// per group, heaviest first (samples without the label last, as `[no key]`), then the
/// heaviest functions or lines of each group, with percentages of the whole profile.
pub(crate) fn grouped_table(
    profile: &Profile,
    key: &str,
    granularity: Granularity,
    column: Option<usize>,
) -> String {
    const GROUPS: usize = 20;
    const ROWS: usize = 10;
    let (unit, kind) = column_names(profile, column);
    let key_index = profile.string_table.iter().position(|s| s == key);
    let value_of = |sample: &crate::profile::proto::Sample| -> Option<&str> {
        let key_index = key_index? as i64;
        sample
            .label
            .iter()
            .find(|label| label.key == key_index && label.str != 0)
            .map(|label| profile.string(label.str))
    };
    let mut groups: HashMap<Option<&str>, i64> = HashMap::new();
    let mut total = 0i64;
    for sample in &profile.sample {
        let value = column
            .and_then(|c| sample.value.get(c).copied())
            .unwrap_or(0);
        total += value;
        *groups.entry(value_of(sample)).or_default() += value;
    }
    let mut groups: Vec<(Option<&str>, i64)> = groups.into_iter().collect();
    groups.sort_by(|a, b| (a.0.is_none(), -a.1, a.0).cmp(&(b.0.is_none(), -b.1, b.0)));
    let name = |group: Option<&str>| match group {
        Some(value) => format!("{key}={value}"),
        None => format!("[no {key}]"),
    };
    let mut out = String::new();
    header(&mut out, profile, &kind, total, &unit);
    let _ = writeln!(out, "Grouped by label {key}: {} groups", groups.len());
    let _ = writeln!(out, "{:>10} {:>7}  group", "flat", "flat%");
    for &(group, value) in &groups {
        let _ = writeln!(
            out,
            "{:>10} {:>7}  {}",
            format_value(value, &unit),
            percent(value, total),
            name(group)
        );
    }
    for &(group, value) in groups.iter().take(GROUPS) {
        let _ = writeln!(
            out,
            "\n{}: {} ({} of the total)",
            name(group),
            format_value(value, &unit),
            percent(value, total)
        );
        let (rows, _) = top_where(profile, granularity, column, &|sample| {
            value_of(sample) == group
        });
        rows_table(&mut out, &rows, total, &unit, ROWS);
    }
    if groups.len() > GROUPS {
        let _ = writeln!(
            out,
            "\n{} more groups; `go tool pprof -tagfocus {key}=VALUE` shows any one",
            groups.len() - GROUPS
        );
    }
    out
}

/// The `-top` table of `rows` (the first `limit`), percentages of `total`.
fn rows_table(out: &mut String, rows: &[TopRow], total: i64, unit: &str, limit: usize) {
    let shown: Vec<&TopRow> = rows.iter().take(limit).collect();
    let shown_flat: i64 = shown.iter().map(|r| r.flat).sum();
    let _ = writeln!(
        out,
        "Showing nodes accounting for {}, {} of {} total",
        format_value(shown_flat, unit),
        percent(shown_flat, total),
        format_value(total, unit),
    );
    if rows.len() > shown.len() {
        let _ = writeln!(
            out,
            "Showing top {} nodes out of {}",
            shown.len(),
            rows.len()
        );
    }
    let _ = writeln!(
        out,
        "{:>10} {:>7} {:>7} {:>10} {:>7}",
        "flat", "flat%", "sum%", "cum", "cum%"
    );
    let mut sum = 0i64;
    for row in shown {
        sum += row.flat;
        let _ = writeln!(
            out,
            "{:>10} {:>7} {:>7} {:>10} {:>7}  {}",
            format_value(row.flat, unit),
            percent(row.flat, total),
            percent(sum, total),
            format_value(row.cum, unit),
            percent(row.cum, total),
            row.name,
        );
    }
}

fn percent(part: i64, total: i64) -> String {
    if total == 0 {
        return "0%".to_owned();
    }
    let value = part as f64 * 100.0 / total as f64;
    trim(format!("{value:.2}")) + "%"
}

fn trim(text: String) -> String {
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    }
}

/// The flamegraph of a profile: stacks root first, widths from the `samples` column if the
/// profile has one (CPU), else from its default column (heap: `inuse_space`).
#[cfg(test)]
#[cfg(feature = "flamegraph")]
pub(crate) fn flamegraph(profile: &Profile, title: &str, subtitle: &str) -> Result<String, String> {
    flamegraph_in(profile, None, title, subtitle)
}

/// The flamegraph of a profile, its widths from `column` if given, else from the
/// `samples` column if the profile has one (CPU), else from its default column.
#[cfg(feature = "flamegraph")]
fn flamegraph_in(
    profile: &Profile,
    column: Option<usize>,
    title: &str,
    subtitle: &str,
) -> Result<String, String> {
    let column = column.or_else(|| {
        profile
            .sample_type
            .iter()
            .position(|t| profile.string(t.ty) == "samples")
            .or_else(|| value_index(profile))
    });
    let Some(column) = column else {
        return Err("the profile has no values to draw".to_owned());
    };
    let unit = match profile.string(profile.sample_type[column].unit) {
        "count" => "samples".to_owned(),
        other => other.to_owned(),
    };
    let mut folded: HashMap<String, i64> = HashMap::new();
    for (stack, values) in sample_stacks_by(profile, Granularity::Functions) {
        let value = values.get(column).copied().unwrap_or(0);
        if value <= 0 {
            continue;
        }
        // inferno splits frames on `;` and the count on the last space.
        let line = stack
            .iter()
            .rev()
            .map(|name| name.replace(';', ":"))
            .collect::<Vec<_>>()
            .join(";");
        *folded.entry(line).or_default() += value;
    }
    let mut lines: Vec<String> = folded
        .into_iter()
        .map(|(stack, value)| format!("{stack} {value}"))
        .collect();
    lines.sort_unstable();
    if lines.is_empty() {
        // inferno refuses an empty input; an empty picture still says what happened.
        return Ok(format!(
            "<?xml version=\"1.0\" standalone=\"no\"?>\n<svg version=\"1.1\" width=\"1200\" \
             height=\"60\" xmlns=\"http://www.w3.org/2000/svg\"><text x=\"600\" y=\"35\" \
             text-anchor=\"middle\" font-family=\"Verdana\" font-size=\"17\">{} ({}): no \
             samples were taken</text></svg>\n",
            escape(title),
            escape(subtitle)
        ));
    }
    let mut options = inferno::flamegraph::Options::default();
    options.title = title.to_owned();
    options.subtitle = Some(subtitle.to_owned());
    options.count_name = unit;
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut svg)
        .map_err(|e| format!("could not draw the flamegraph: {e}"))?;
    String::from_utf8(svg).map_err(|e| format!("the flamegraph is not UTF-8: {e}"))
}

/// Escapes text for HTML content and attribute values.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Scales a value like pprof does: `1.50s`, `20ms`, `64MB`, `512kB`, `1234`.
pub(crate) fn format_value(value: i64, unit: &str) -> String {
    let v = value as f64;
    let scaled = |steps: &[(f64, &str)]| {
        let (div, name) = steps
            .iter()
            .rev()
            .find(|(div, _)| v.abs() >= *div)
            .copied()
            .unwrap_or(steps[0]);
        trim(format!("{:.2}", v / div)) + name
    };
    match unit {
        "nanoseconds" => scaled(&[(1.0, "ns"), (1e3, "us"), (1e6, "ms"), (1e9, "s")]),
        "bytes" => scaled(&[
            (1.0, "B"),
            (1024.0, "kB"),
            (1024.0 * 1024.0, "MB"),
            (1024.0 * 1024.0 * 1024.0, "GB"),
        ]),
        _ => value.to_string(),
    }
}

#[cfg(test)]
mod tests;
