//! Line programs: the row covering each wanted address, with its file's path, read only
//! until every address has its row.

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::path::PathBuf;

use gimli::{Reader as _, UnitRef};

use super::sections::Reader;
use super::units::Unplaced;

/// A file and line from the line program.
pub(crate) type Row = (String, i64);

/// The line-table row covering each of `at` (sorted), with its file's path.
pub(crate) fn line_rows(unit: UnitRef<'_, Reader<'_>>, at: &[u64]) -> Option<Vec<Option<Row>>> {
    let program = unit.line_program.clone()?;
    let mut rows = program.rows();
    let mut covering: Vec<Option<(u64, i64)>> = vec![None; at.len()];
    let mut uncovered = at.len();
    let mut unplaced = Unplaced::new(at.len());
    // The previous row of the current sequence: its address, file and line.
    let mut previous: Option<(u64, u64, i64)> = None;
    // The first of `at` not below the previous row and not yet covered: rows of a
    // sequence only go up, so this moves forward instead of being searched for at every
    // row, and a covered address is skipped at once (a crafted program of a million
    // sequences over the same code costs a million steps, not a million times `at`).
    let mut next = 0;
    let mut discarded = false;
    // The program is read only until every address has its row: on average half of it.
    while uncovered > 0
        && let Some((_, row)) = rows.next_row().ok()?
    {
        let address = row.address();
        match previous {
            None => {
                // A sequence starts. Sequences of code the linker discarded are left at
                // address 0.
                discarded = address == 0;
                next = unplaced.first_from(at.partition_point(|a| *a < address));
            }
            Some((_, file, line)) if !discarded => {
                while next < at.len() && at[next] < address {
                    covering[next] = Some((file, line));
                    uncovered -= 1;
                    unplaced.place(next);
                    next = unplaced.first_from(next + 1);
                }
            }
            Some(_) => {}
        }
        previous = if row.end_sequence() {
            None
        } else {
            let line = row.line().map_or(0, NonZeroU64::get);
            Some((address, row.file_index(), line as i64))
        };
    }
    let header = rows.header();
    let mut paths: HashMap<u64, String> = HashMap::new();
    Some(
        covering
            .into_iter()
            .map(|found| {
                let (file, line) = found?;
                let path = paths
                    .entry(file)
                    .or_insert_with(|| file_path(unit, header, file).unwrap_or_default());
                Some((path.clone(), line))
            })
            .collect(),
    )
}

/// A line program's file `index` as a path: joined to its directory, and to the unit's
/// compilation directory when still relative, as compilers record them.
pub(crate) fn file_path<'a>(
    unit: UnitRef<'_, Reader<'a>>,
    header: &gimli::LineProgramHeader<Reader<'a>>,
    index: u64,
) -> Option<String> {
    let file = header.file(index)?;
    let mut path = PathBuf::new();
    if let Some(dir) = unit.comp_dir {
        path.push(&*dir.to_string_lossy().ok()?);
    }
    if let Some(dir) = file.directory(header) {
        path.push(&*unit.attr_string(dir).ok()?.to_string_lossy().ok()?);
    }
    path.push(
        &*unit
            .attr_string(file.path_name())
            .ok()?
            .to_string_lossy()
            .ok()?,
    );
    Some(path.to_string_lossy().into_owned())
}

/// A path from the unit's line program's file table.
pub(crate) fn program_file(unit: UnitRef<'_, Reader<'_>>, index: u64) -> Option<String> {
    let program = unit.line_program.as_ref()?;
    file_path(unit, program.header(), index)
}
