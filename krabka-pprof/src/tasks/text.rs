//! Traces to text: each task's backtraces merged into one tree, identical trees
//! counted once, the largest group first. The order is the dump's, never a hash map's,
//! so two identical tasks always read the same and land in one group.

use std::collections::HashMap;
use std::fmt::Write as _;

/// What a task with no backtrace shows: it was traced, but reached no tokio resource.
const NO_TRACE: &str = "(no trace: the task awaits nothing of tokio's, such as a \
                        channel of another crate, or it finished while traced)";

/// `tasks: total N`, then each group: its count, then its tree.
pub(crate) fn grouped(tasks: impl Iterator<Item = Vec<Vec<String>>>) -> String {
    let mut total = 0_usize;
    let mut order: Vec<String> = Vec::new();
    let mut counts: HashMap<String, usize> = HashMap::new();
    for backtraces in tasks {
        total += 1;
        let tree = tree(&backtraces);
        let count = counts.entry(tree).or_insert_with_key(|tree| {
            order.push(tree.clone());
            0
        });
        *count += 1;
    }
    let mut groups: Vec<(usize, String)> = order
        .into_iter()
        .map(|tree| (counts[&tree], tree))
        .collect();
    // Stable: equal groups keep the dump's order.
    groups.sort_by_key(|group| std::cmp::Reverse(group.0));
    let mut out = format!("tasks: total {total}\n");
    for (count, tree) in groups {
        let noun = if count == 1 { "task" } else { "tasks" };
        let _ = write!(out, "\n{count} {noun}:\n{tree}");
    }
    out
}

/// A node of the merged tree: a frame and the frames it called, in first-seen order.
struct Node<'a> {
    frame: &'a str,
    children: Vec<Node<'a>>,
}

/// The task's backtraces as one tree, as tokio draws a trace: `╼ frame`, then each
/// callee under its caller with `├╼`/`└╼`. Every line ends with a newline.
fn tree(backtraces: &[Vec<String>]) -> String {
    let mut roots: Vec<Node<'_>> = Vec::new();
    for path in backtraces {
        let mut level = &mut roots;
        for frame in path {
            let at = match level.iter().position(|node| node.frame == frame) {
                Some(at) => at,
                None => {
                    level.push(Node {
                        frame,
                        children: Vec::new(),
                    });
                    level.len() - 1
                }
            };
            level = &mut level[at].children;
        }
    }
    if roots.is_empty() {
        return format!("{NO_TRACE}\n");
    }
    let mut out = String::new();
    for root in &roots {
        let _ = writeln!(out, "╼ {}", root.frame);
        draw(&mut out, &root.children, "");
    }
    out
}

fn draw(out: &mut String, nodes: &[Node<'_>], indent: &str) {
    for (i, node) in nodes.iter().enumerate() {
        let last = i + 1 == nodes.len();
        let (branch, below) = if last {
            ("└╼ ", "   ")
        } else {
            ("├╼ ", "│  ")
        };
        let _ = writeln!(out, "{indent}{branch}{}", node.frame);
        draw(out, &node.children, &format!("{indent}{below}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(frames: &[&str]) -> Vec<String> {
        frames.iter().map(|frame| (*frame).to_owned()).collect()
    }

    #[test]
    fn identical_traces_are_one_group_largest_first() {
        let parked = vec![path(&["app::parked", "tokio::oneshot::recv"])];
        let sleeping = vec![path(&["app::sleeping", "tokio::sleep"])];
        let text = grouped(
            [
                sleeping.clone(),
                parked.clone(),
                parked.clone(),
                sleeping,
                parked,
                vec![],
            ]
            .into_iter(),
        );
        assert_eq!(
            text,
            "tasks: total 6\n\
             \n3 tasks:\n╼ app::parked\n└╼ tokio::oneshot::recv\n\
             \n2 tasks:\n╼ app::sleeping\n└╼ tokio::sleep\n\
             \n1 task:\n"
                .to_owned()
                + NO_TRACE
                + "\n"
        );
    }

    #[test]
    fn backtraces_of_one_task_merge_at_their_common_callers() {
        // A `join!` of two leaves: two backtraces that share their outer frames.
        let text = tree(&[
            path(&["main", "join", "a", "leaf"]),
            path(&["main", "join", "b", "leaf"]),
            path(&["main", "join", "b", "other"]),
        ]);
        assert_eq!(
            text,
            "╼ main\n\
             └╼ join\n   \
                ├╼ a\n   \
                │  └╼ leaf\n   \
                └╼ b\n      \
                   ├╼ leaf\n      \
                   └╼ other\n"
        );
    }

    #[test]
    fn no_tasks_is_a_total_of_zero() {
        assert_eq!(grouped(std::iter::empty()), "tasks: total 0\n");
    }
}
