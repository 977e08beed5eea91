//! krabka-pprof's task hooks (`krabka_pprof::task_hooks`), in the build with tokio's
//! unstable APIs: a task that blocks inside its poll where its stack cannot be read down to
//! the runtime's poll is in `/blocking` by the hooks, with the system call it sleeps in;
//! the same task on a runtime without them, unlabelled, is not, though
//! `/wall?threads=all` sees it asleep. Here the stack stops below a frame that realigns
//! it, which a sleeping thread's registers cannot unwind: the case of x86_64 with glibc,
//! where CI runs this build (on aarch64 no sleeping stack is read at all, and this test's
//! look at the frames would need another way to tell the two tasks apart).

use std::os::fd::{AsRawFd as _, OwnedFd};
use std::sync::Mutex;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use krabka_pprof::pprof_routes;
use krabka_pprof_tests::{
    Options, Profile, TestServer, client, comments, decode, krabka_sampler_only, serial, stacks,
    string,
};
use reqwest::StatusCode;
use tokio::sync::Notify;

#[pprof_routes]
fn app() -> Router {
    Router::new()
        .route(
            "/hooked",
            get(|| async { wait(&HOOKED, hooked_poll_block) }),
        )
        .route("/plain", get(|| async { wait(&PLAIN, plain_poll_block) }))
}

/// A route's pipe (its read end polled inside the handler's poll until the test writes
/// to the other) and the event of a poll beginning.
struct Gate {
    ends: Mutex<Option<(OwnedFd, OwnedFd)>>,
    entered: Notify,
}

static HOOKED: Gate = Gate {
    ends: Mutex::new(None),
    entered: Notify::const_new(),
};
static PLAIN: Gate = Gate {
    ends: Mutex::new(None),
    entered: Notify::const_new(),
};

impl Gate {
    fn open(&self) {
        let mut fds = [0; 2];
        // SAFETY: pipe writes two new descriptors into `fds`.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both are new and owned here alone.
        let ends = unsafe {
            use std::os::fd::FromRawFd as _;
            (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))
        };
        *self.ends.lock().unwrap() = Some(ends);
    }

    /// Lets the poll go: the pipe becomes readable.
    fn release(&self) {
        if let Some((_, write)) = self.ends.lock().unwrap().as_ref() {
            // SAFETY: one byte from a live buffer to an open descriptor.
            unsafe { libc::write(write.as_raw_fd(), b"x".as_ptr().cast(), 1) };
        }
    }
}

/// Blocks the worker inside the handler's poll, in `block`, until the test releases it
/// (60 s at most).
fn wait(gate: &Gate, block: fn(i32)) -> &'static str {
    let read = gate
        .ends
        .lock()
        .unwrap()
        .as_ref()
        .map(|(read, _)| read.as_raw_fd());
    let Some(read) = read else {
        return "no gate";
    };
    // Wake the other worker first, as any other traffic would (`dumps.rs` says why): it
    // then parks on the I/O driver, and serves the profile's requests while this one is
    // held.
    tokio::spawn(async {});
    tokio::spawn(async {});
    gate.entered.notify_one();
    block(read);
    "released"
}

/// Locals that must lie on a 64-byte boundary: the function realigns its stack, so its
/// caller is found through the frame pointer, which no file gives for a sleeping thread.
#[repr(C, align(64))]
struct Aligned([u8; 1024]);

#[inline(never)]
fn hooked_poll_block(fd: i32) {
    realigned_poll(fd);
}

#[inline(never)]
fn plain_poll_block(fd: i32) {
    realigned_poll(fd);
}

#[inline(always)]
fn realigned_poll(fd: i32) {
    let mut locals = Aligned([0; 1024]);
    std::hint::black_box(&mut locals);
    let mut pollfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd, live for the call.
    unsafe { libc::poll(&mut pollfd, 1, 60_000) };
    std::hint::black_box(&mut locals);
}

/// Whether sample `index` carries label `key` with a value in `values`.
fn labelled(profile: &Profile, index: usize, key: &str, values: &[&str]) -> bool {
    profile.sample[index].label.iter().any(|label| {
        string(profile, label.key) == key && values.contains(&string(profile, label.str))
    })
}

/// The indexes of the samples whose stack names a function ending in `name`.
fn samples_in(profile: &Profile, name: &str) -> Vec<usize> {
    stacks(profile)
        .iter()
        .enumerate()
        .filter(|(_, (names, _))| names.iter().any(|n| n.ends_with(name)))
        .map(|(index, _)| index)
        .collect()
}

#[tokio::test]
async fn a_task_blocked_where_its_stack_cannot_be_read_is_in_the_blocking_view_by_the_hooks() {
    if krabka_sampler_only(
        "a_task_blocked_where_its_stack_cannot_be_read_is_in_the_blocking_view_by_the_hooks",
        "wall-clock profiles need krabka-pprof's own sampler",
    ) {
        return;
    }
    let _serial = serial().await;
    HOOKED.open();
    PLAIN.open();
    let hooked = TestServer::start_with(
        Options {
            task_hooks: true,
            ..Options::default()
        },
        app,
    );
    let plain = TestServer::start(app);
    let http = client();
    let hooked_request = tokio::spawn(http.get(hooked.url("/hooked")).send());
    let plain_request = tokio::spawn(http.get(plain.url("/plain")).send());
    HOOKED.entered.notified().await;
    PLAIN.entered.notified().await;

    // Both windows open while both workers sleep in their polls, released only after.
    let (blocking, wall) = tokio::join!(
        http.get(hooked.url("/debug/pprof/blocking?seconds=1"))
            .send(),
        http.get(hooked.url("/debug/pprof/wall?seconds=1&threads=all"))
            .send(),
    );
    HOOKED.release();
    PLAIN.release();
    for request in [hooked_request, plain_request] {
        let response = tokio::time::timeout(Duration::from_secs(60), request)
            .await
            .expect("released")
            .unwrap()
            .unwrap();
        assert_eq!(response.text().await.unwrap(), "released");
    }
    let (blocking, wall) = (blocking.unwrap(), wall.unwrap());
    assert_eq!(blocking.status(), StatusCode::OK);
    assert_eq!(wall.status(), StatusCode::OK);
    let blocking = decode(&blocking.bytes().await.unwrap());
    let wall = decode(&wall.bytes().await.unwrap());

    // The wall profile of every thread sees both asleep in poll, each stack read up to
    // the frame that needs the frame pointer: neither shows the runtime's poll.
    for name in ["hooked_poll_block", "plain_poll_block"] {
        let asleep = samples_in(&wall, name);
        assert!(!asleep.is_empty(), "{name} asleep: {:?}", stacks(&wall));
        for &index in &asleep {
            assert!(
                labelled(&wall, index, "syscall", &["poll", "ppoll"]),
                "{name} asleep in poll"
            );
            let (names, _) = &stacks(&wall)[index];
            assert!(
                !names.iter().any(|n| n.contains("run_task")),
                "the stack stops short of the runtime's poll: {names:?}"
            );
        }
    }
    let said = comments(&blocking).join("\n");
    assert!(said.contains("tokio's task hooks installed"), "{said}");
    let hooked_places = samples_in(&blocking, "hooked_poll_block");
    assert!(
        !hooked_places.is_empty(),
        "the hooked task in /blocking: {:?}\n{said}",
        stacks(&blocking)
    );
    for &index in &hooked_places {
        assert!(labelled(&blocking, index, "syscall", &["poll", "ppoll"]));
        assert!(labelled(&blocking, index, "thread_state", &["sleeping"]));
    }
    assert!(
        !said.contains(" 0 by tokio's task hooks"),
        "places told by the hooks counted: {said}"
    );
    assert!(
        samples_in(&blocking, "plain_poll_block").is_empty(),
        "without hooks or labels, a stack cut short is not known to be in a poll: {:?}",
        stacks(&blocking)
    );
}
