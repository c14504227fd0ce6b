<?php
/*
 * Plugin Name: slotgate hold
 * Description: Holds a REST write of a post, after WordPress saved it or
 * before, so that "applied, answer lost" and "accepted, not yet saved" are
 * real faults (testkit::server::OwnedWordPress).
 *
 * While <SLOTGATE_DIR>/hold.json ({"seconds": N, "count": K, "when":
 * "after"|"before", "only": "create"|"update"}) says K > 0, a REST create or
 * update of a post takes one of the K (under an flock, as PHP's built-in
 * server runs several workers), counts itself in <SLOTGATE_DIR>/held and
 * sleeps N seconds:
 * - "after" (the default): once saved, before WordPress answers: a client
 *   with a shorter timeout gives up on a write that is already in the posts
 *   table;
 * - "before": before it is saved (`rest_pre_insert_post`): a client with a
 *   shorter timeout gives up on a write no read can see yet, and PHP, which
 *   keeps running a request whose client has gone, saves it afterwards.
 * With "only", just creates (or just updates of existing posts) are held.
 */
function slotgate_hold_take($when, $is_create)
{
    $dir = SLOTGATE_DIR;
    $lock = fopen("$dir/hold.lock", 'c');
    if ($lock === false || !flock($lock, LOCK_EX)) {
        return 0;
    }
    $seconds = 0;
    $hold = json_decode((string) @file_get_contents("$dir/hold.json"), true);
    if (is_array($hold) && (int) ($hold['count'] ?? 0) > 0
        && ($hold['when'] ?? 'after') === $when
        && (($hold['only'] ?? '') === '' || ($hold['only'] === 'create') === $is_create)) {
        $hold['count'] = (int) $hold['count'] - 1;
        file_put_contents("$dir/hold.json.tmp", json_encode($hold));
        rename("$dir/hold.json.tmp", "$dir/hold.json");
        $held = (int) @file_get_contents("$dir/held") + 1;
        file_put_contents("$dir/held.tmp", (string) $held);
        rename("$dir/held.tmp", "$dir/held");
        $seconds = (int) ($hold['seconds'] ?? 0);
    }
    flock($lock, LOCK_UN);
    fclose($lock);
    return $seconds;
}

add_filter('rest_pre_insert_post', function ($prepared, $request) {
    $seconds = slotgate_hold_take('before', empty($prepared->ID));
    if ($seconds > 0) {
        // The client may give up meanwhile; the save must still happen.
        ignore_user_abort(true);
        sleep($seconds);
    }
    return $prepared;
}, 10, 2);

add_action('rest_after_insert_post', function ($post, $request, $creating) {
    $seconds = slotgate_hold_take('after', (bool) $creating);
    if ($seconds > 0) {
        sleep($seconds);
    }
}, 10, 3);
