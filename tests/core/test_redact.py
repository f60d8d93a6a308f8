from draftsmith.core.redact import redact, redact_url


def test_redact_url_masks_the_password_and_keeps_the_rest():
    assert redact_url("http://user:s3cret@host:8000/v1") == "http://user:***@host:8000/v1"
    assert redact_url("https://tok3n@host/v1") == "https://***@host/v1"
    assert redact_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000"
    assert redact_url("https://a:p@ss@host/x") == "https://a:***@host/x"


def test_redact_masks_every_url_in_free_text():
    text = "endpoint http://u:k1@10.0.0.1:5/v1 is down (http://v:k2@h: refused); mail a@b stays"
    assert redact(text) == "endpoint http://u:***@10.0.0.1:5/v1 is down (http://v:***@h: refused); mail a@b stays"
