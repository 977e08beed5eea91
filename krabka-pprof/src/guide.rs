//! The user guide's pages, one module each (they hold no items): each page is written
//! once, as a markdown file in `krabka-pprof/docs/`, and included here. The HTTP contract
//! is in [the crate's root docs](crate#the-http-contract), the attribute's keys in
//! [`pprof_routes`](crate::pprof_routes).

#[doc = include_str!("../docs/cpu.md")]
pub mod cpu {}

#[doc = include_str!("../docs/heap.md")]
pub mod heap {}

#[doc = include_str!("../docs/labels.md")]
pub mod labels {}

#[doc = include_str!("../docs/recent.md")]
pub mod recent {}

#[doc = include_str!("../docs/push.md")]
pub mod push {}

#[doc = include_str!("../docs/scraping.md")]
pub mod scraping {}

#[doc = include_str!("../docs/threads.md")]
pub mod threads {}

#[doc = include_str!("../docs/release-builds.md")]
pub mod release_builds {}

#[doc = include_str!("../docs/platforms.md")]
pub mod platforms {}

#[doc = include_str!("../docs/limits.md")]
pub mod limits {}

#[doc = include_str!("../docs/operating.md")]
pub mod operating {}

#[doc = include_str!("../docs/wall.md")]
pub mod wall {}
