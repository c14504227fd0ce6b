<?php
/*
 * Plugin Name: slotgate ledger
 * Description: WordPress's own record of every status change of a post, so
 * that a judge can count publishes without trusting slotgate
 * (testkit::server::OwnedWordPress::transitions).
 *
 * Appends one JSON line per event to <SLOTGATE_DIR>/transitions.jsonl:
 * {"id", "op", "from", "to", "at"} with `at` in microseconds since the
 * epoch, and `op`:
 * - `save`: `transition_post_status`, which fires on every save, also when
 *   the status stays the same, so a second write of `publish` to a
 *   published post is a line `publish -> publish`;
 * - `delete`: a post deleted for good (deletion fires no transition),
 *   `to` = `deleted`;
 * - `read`: a REST read of one post (`GET /wp/v2/posts/<id>`), `from` =
 *   `to` = its status as the reader saw it. A judge needs it to tell an
 *   editor's change that came after a client's read-before-write from one
 *   that came before.
 * Lines are appended under an exclusive lock: PHP's built-in server runs
 * several workers.
 */
function slotgate_ledger($id, $op, $from, $to) {
    $line = json_encode([
        'id' => (int) $id,
        'op' => $op,
        'from' => (string) $from,
        'to' => (string) $to,
        'at' => (int) round(microtime(true) * 1e6),
    ]) . "\n";
    file_put_contents(SLOTGATE_DIR . '/transitions.jsonl', $line, FILE_APPEND | LOCK_EX);
}
add_action('transition_post_status', function ($new, $old, $post) {
    if ($post->post_type === 'post') {
        slotgate_ledger($post->ID, 'save', $old, $new);
    }
}, 10, 3);
add_action('before_delete_post', function ($id, $post = null) {
    $post = $post ?: get_post($id);
    if ($post && $post->post_type === 'post') {
        slotgate_ledger($id, 'delete', $post->post_status, 'deleted');
    }
}, 10, 2);
add_filter('rest_prepare_post', function ($response, $post, $request) {
    if ($request->get_method() === 'GET' && $request->get_param('id')) {
        slotgate_ledger($post->ID, 'read', $post->post_status, $post->post_status);
    }
    return $response;
}, 10, 3);
