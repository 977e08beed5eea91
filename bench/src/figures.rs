//! The figures of the README's Performance table, one file each, named after its id; M1
//! and M4 come from the same rounds, so they share `m1_m4.rs`. Each starts its own
//! services through the harness and returns its rows of the table.

pub mod h;
pub mod m1_m4;
pub mod m2;
pub mod m3;
pub mod m5;
pub mod m6;
pub mod s;
pub mod v;

pub const MB: f64 = 1024.0 * 1024.0;

/// One line of the final table.
pub struct Row {
    pub id: &'static str,
    pub figure: String,
    pub target: &'static str,
    pub measured: String,
}
