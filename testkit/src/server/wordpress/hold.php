<?php
/*
 * Plugin Name: slotgate hold
 * Description: Holds a REST write after WordPress saved it, so that
 * "applied, answer lost" is a real fault (testkit::server::OwnedWordPress).
 *
 * While <SLOTGATE_DIR>/hold.json ({"seconds": N, "count": K}) says K > 0, a
 * REST create or update of a post, once saved, takes one of the K (under an
 * flock, as PHP's built-in server runs several workers), counts itself in
 * <SLOTGATE_DIR>/held and sleeps N seconds before WordPress answers: a client
 * with a shorter timeout gives up on a write that is already in the posts
 * table.
 */
add_action('rest_after_insert_post', function () {
    $dir = SLOTGATE_DIR;
    $lock = fopen("$dir/hold.lock", 'c');
    if ($lock === false || !flock($lock, LOCK_EX)) {
        return;
    }
    $seconds = 0;
    $hold = json_decode((string) @file_get_contents("$dir/hold.json"), true);
    if (is_array($hold) && (int) ($hold['count'] ?? 0) > 0) {
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
    if ($seconds > 0) {
        sleep($seconds);
    }
});
