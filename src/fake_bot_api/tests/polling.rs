//! `getWebhookInfo`, the deaf poller, and overlapping polls.

use super::*;

#[tokio::test]
async fn get_webhook_info_counts_the_unconfirmed_updates() {
    let h = harness().await;
    let info = |pending: usize| json!({"url": "", "has_custom_certificate": false, "pending_update_count": pending});
    assert_eq!(h.ok("getWebhookInfo", json!({})).await, info(0));
    let first = h.say(USER, None, "one");
    h.say(USER, None, "two");
    assert_eq!(h.ok("getWebhookInfo", json!({})).await, info(2));
    h.ok("getUpdates", json!({"offset": first + 1})).await;
    assert_eq!(h.ok("getWebhookInfo", json!({})).await, info(1));
}

#[tokio::test]
async fn a_deaf_poller_hears_nothing_while_updates_pile_up() {
    let h = harness().await;
    let first = h.say(USER, None, "one");
    h.api
        .inject_fault("getUpdates", Fault::Deaf { immediately: true }, 2);
    for _ in 0..2 {
        // Even an offset past the update confirms nothing while deaf.
        let heard = h
            .ok("getUpdates", json!({"offset": first + 1, "timeout": 30}))
            .await;
        assert_eq!(heard, json!([]));
    }
    let second = h.say(USER, None, "two");
    assert_eq!(h.api.pending_update_ids(), [first, second]);
    assert_eq!(
        h.ok("getWebhookInfo", json!({})).await["pending_update_count"],
        json!(2)
    );
    let heard = h.ok("getUpdates", json!({"offset": first})).await;
    assert_eq!(update_ids(&heard), [first, second]);
    assert_eq!(h.api.stats().polls.polls, 3, "deaf polls are polls too");
}

#[tokio::test]
async fn a_deaf_long_poll_waits_out_its_timeout_even_when_updates_arrive() {
    let h = harness().await;
    h.api
        .inject_fault_until_cleared("getUpdates", Fault::Deaf { immediately: false });
    let poll = h.call("getUpdates", json!({"timeout": 1}));
    let inject = async {
        h.api
            .wait_for_poller(WAIT)
            .await
            .expect("the poll reaches the fake");
        h.say(USER, None, "unheard")
    };
    let ((status, body), update_id) = tokio::join!(poll, inject);
    assert_eq!((status, &body["result"]), (200, &json!([])));
    assert_eq!(h.ok("getUpdates", json!({})).await, json!([]));
    h.api.clear_faults();
    assert_eq!(
        update_ids(&h.ok("getUpdates", json!({})).await),
        [update_id]
    );
}

#[tokio::test]
async fn overlapping_polls_are_counted_and_short_poll_hand_overs_apart() {
    let h = harness().await;
    // Polls one after another never overlap.
    h.ok("getUpdates", json!({})).await;
    h.ok("getUpdates", json!({})).await;
    assert_eq!(h.api.stats().polls.overlaps, 0);

    let older = h.call("getUpdates", json!({"timeout": 60}));
    let rivals = async {
        h.api.wait_for_poller(WAIT).await.expect("the first poll");
        // A second long poll while the first is open: an overlap.
        let newer = h.call("getUpdates", json!({"timeout": 60}));
        let hand_over = async {
            h.api
                .wait_for_call(|c| c.method == "getUpdates" && c.status == Some(409), WAIT)
                .await
                .expect("the first poll is terminated");
            h.api.wait_for_poller(WAIT).await.expect("the second poll");
            // A short poll while the second is open: a hand-over kind of overlap.
            h.call("getUpdates", json!({"timeout": 0})).await
        };
        tokio::join!(newer, hand_over)
    };
    let ((older_status, _), ((newer_status, _), (short_status, _))) = tokio::join!(older, rivals);
    assert_eq!((older_status, newer_status, short_status), (409, 409, 200));
    let polls = h.api.stats().polls;
    assert_eq!(
        (
            polls.polls,
            polls.overlaps,
            polls.short_poll_overlaps,
            polls.max_open,
            polls.open_now
        ),
        (5, 2, 1, 2, 0)
    );
}

#[tokio::test]
async fn a_poll_its_client_gave_up_on_leaves_no_poller_behind() {
    let h = harness().await;
    let url = format!("{}/getUpdates?timeout=60", h.server.bot_url());
    let abandoned = h
        .http
        .get(url)
        .timeout(Duration::from_millis(200))
        .send()
        .await;
    assert!(abandoned.expect_err("no answer in time").is_timeout());
    h.api
        .wait_until(|api| (api.stats().polls.open_now == 0).then_some(()), WAIT)
        .await
        .expect("the server notices the client left");
    h.ok("getUpdates", json!({})).await;
    let polls = h.api.stats().polls;
    assert_eq!((polls.polls, polls.overlaps), (2, 0));
}
