use super::*;

#[test]
fn a_scope_ends_when_its_closure_unwinds() {
    let caught = std::panic::catch_unwind(|| {
        scope(&[("tenant", "unwinds")], || {
            assert_eq!(current().get("tenant"), Some("unwinds"));
            panic!("the closure fails");
        })
    });
    assert!(caught.is_err());
    assert!(current().is_empty(), "{:?}", current());
}

#[test]
fn a_future_carries_its_labels_into_each_poll_and_merges_over_the_poller() {
    let waker = std::task::Waker::noop();
    let mut cx = Context::from_waker(waker);
    let mut polls = 0;
    let mut seen = Vec::new();
    let mut future = std::pin::pin!(
        std::future::poll_fn(|_| {
            polls += 1;
            seen.push(current());
            if polls < 3 {
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
        .with_labels(&[("tenant", "future"), ("route", "/inner")])
    );
    assert!(future.as_mut().poll(&mut cx).is_pending());
    assert!(current().is_empty(), "the poll put the word back");
    scope(&[("route", "/outer"), ("region", "eu")], || {
        assert!(future.as_mut().poll(&mut cx).is_pending());
        assert!(future.as_mut().poll(&mut cx).is_ready());
    });
    assert_eq!(
        seen[0],
        Labels::new(&[("tenant", "future"), ("route", "/inner")])
    );
    let merged = Labels::new(&[("tenant", "future"), ("route", "/inner"), ("region", "eu")]);
    assert_eq!(seen[1], merged, "the future's value wins over the poller's");
    assert_eq!(seen[2], merged);
}

#[test]
fn current_labels_pass_to_a_future_that_runs_elsewhere() {
    let passed = scope(&[("tenant", "passed")], || {
        std::future::poll_fn(|_| Poll::Ready(current())).with_current_labels()
    });
    assert!(current().is_empty());
    let seen = std::thread::spawn(move || {
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        match std::pin::pin!(passed).poll(&mut cx) {
            Poll::Ready(labels) => labels,
            Poll::Pending => unreachable!("ready at once"),
        }
    })
    .join()
    .expect("the thread");
    assert_eq!(seen.get("tenant"), Some("passed"));
}

#[test]
fn a_set_lists_its_labels_by_key_with_keys_made_nameable() {
    let labels = Labels::new(&[("z", "1"), ("a b", "x=\"y\""), ("thread", "mine")]);
    let pairs: Vec<(&str, &str)> = labels.iter().collect();
    assert_eq!(
        pairs,
        [("a_b", "x=\"y\""), ("user.thread", "mine"), ("z", "1")]
    );
    assert_eq!(
        format!("{labels:?}"),
        r#"{"a_b": "x=\"y\"", "user.thread": "mine", "z": "1"}"#
    );
    assert!(Labels::new(&[]).is_empty());
    assert!(!labels.is_empty());
    // Equal when their labels are, however they were written.
    assert_eq!(
        Labels::new(&[("thread", "mine"), ("a b", "x=\"y\""), ("z", "1")]),
        labels
    );
    assert_ne!(Labels::new(&[("z", "1")]), labels);
    assert_ne!(Labels::new(&[("z", "2")]), Labels::new(&[("z", "1")]));
    assert_eq!(Labels::new(&[]), Labels::new(&[]));
}

#[test]
fn a_future_polled_under_another_poller_merges_over_that_one() {
    let waker = std::task::Waker::noop();
    let mut cx = Context::from_waker(waker);
    let mut seen = Vec::new();
    let mut future = std::pin::pin!(
        std::future::poll_fn(|_| {
            seen.push(current());
            Poll::<()>::Pending
        })
        .with_labels(&[("route", "/inner")])
    );
    assert_eq!(future.labels(), &Labels::new(&[("route", "/inner")]));
    assert!(format!("{future:?}").contains(r#"labels: {"route": "/inner"}"#));
    scope(&[("region", "eu")], || {
        let _ = future.as_mut().poll(&mut cx);
    });
    scope(&[("region", "us")], || {
        let _ = future.as_mut().poll(&mut cx);
        let _ = future.as_mut().poll(&mut cx);
    });
    assert_eq!(
        seen[0],
        Labels::new(&[("route", "/inner"), ("region", "eu")])
    );
    let us = Labels::new(&[("route", "/inner"), ("region", "us")]);
    assert_eq!(seen[1], us, "the merge follows the poller's labels");
    assert_eq!(seen[2], us);
}
