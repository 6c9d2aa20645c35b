"""Existing messages' reserved context keys moved into 0012's columns, and out of `context`.

Its own migration, so its UPDATE runs in a transaction of its own, after the ALTER TABLEs have
committed: it holds row locks on the rows it moves, not the table lock the schema change needs.
One set-based statement each way; only transactional messages ever carried these keys.
"""

from django.db import migrations

KEYS = ("emailhub:unsubscribe", "emailhub:track_opens", "emailhub:track_clicks", "emailhub:test_send")
_ARRAY = "ARRAY[" + ", ".join(f"'{key}'" for key in KEYS) + "]"

# A flag was set when its key held JSON true (as the send path read it); the test send's key
# held the operator's user name, or true when there was none.
FORWARD = f"""
UPDATE delivery_message
   SET list_unsubscribe = coalesce(context -> 'emailhub:unsubscribe' = 'true'::jsonb, false),
       track_opens = coalesce(context -> 'emailhub:track_opens' = 'true'::jsonb, false),
       track_clicks = coalesce(context -> 'emailhub:track_clicks' = 'true'::jsonb, false),
       test_send_by = CASE WHEN NOT context ? 'emailhub:test_send' THEN NULL
                           WHEN jsonb_typeof(context -> 'emailhub:test_send') = 'string'
                           THEN context ->> 'emailhub:test_send'
                           ELSE '' END,
       context = nullif(context - {_ARRAY}, '{{}}'::jsonb)
 WHERE jsonb_typeof(context) = 'object' AND context ?| {_ARRAY}
"""

BACKWARD = """
UPDATE delivery_message
   SET context = coalesce(context, '{}'::jsonb)
       || CASE WHEN list_unsubscribe THEN '{"emailhub:unsubscribe": true}'::jsonb ELSE '{}' END
       || CASE WHEN track_opens THEN '{"emailhub:track_opens": true}'::jsonb ELSE '{}' END
       || CASE WHEN track_clicks THEN '{"emailhub:track_clicks": true}'::jsonb ELSE '{}' END
       || CASE WHEN test_send_by IS NULL THEN '{}'::jsonb
               ELSE jsonb_build_object('emailhub:test_send',
                                       CASE WHEN test_send_by = '' THEN 'true'::jsonb
                                            ELSE to_jsonb(test_send_by) END) END,
       list_unsubscribe = false, track_opens = false, track_clicks = false, test_send_by = NULL
 WHERE list_unsubscribe OR track_opens OR track_clicks OR test_send_by IS NOT NULL
"""


class Migration(migrations.Migration):
    dependencies = [("delivery", "0012_message_flags")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD, elidable=True)]
