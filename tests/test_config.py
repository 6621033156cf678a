"""Settings: defaults, TYPEWRITER_* variables, overrides, and errors that name the variable."""

from __future__ import annotations

from ipaddress import ip_network

import pytest

from typewriter.config import ConfigError, Settings, parse_address_caps


def test_defaults_serve_loopback_on_8000_with_the_embedded_model():
    s = Settings.from_env({})
    assert (s.serving.host, s.serving.port, s.model.model_path) == ("127.0.0.1", 8000, None)
    assert (s.engine.max_active, s.engine.max_queue, s.engine.max_context) == (None, 32, 2048)  # None: sized at start
    assert s.answers.default_length <= s.answers.length_cap < s.engine.max_context


def test_variables_are_parsed_to_their_field_types():
    s = Settings.from_env({
        "TYPEWRITER_PORT": "9001", "TYPEWRITER_MAX_ACTIVE": " 8 ", "TYPEWRITER_PING_TIMEOUT_S": "2.5",
        "TYPEWRITER_MODEL_PATH": "/models/x.gguf", "TYPEWRITER_SYSTEM_PROMPT": "  Be terse.  ",
        "TYPEWRITER_REQUEST_TIMEOUT_S": "30", "TYPEWRITER_LOG_LEVEL": "DEBUG",
    })
    assert (s.serving.port, s.engine.max_active, s.socket.ping_timeout_s) == (9001, 8, 2.5)
    assert (s.model.model_path, s.answers.system_prompt) == ("/models/x.gguf", "  Be terse.  ")
    assert (s.engine.request_timeout_s, s.serving.log_level) == (30.0, "debug")


def test_none_clears_an_optional_setting():
    assert Settings.from_env({"TYPEWRITER_REQUEST_TIMEOUT_S": "none"}).engine.request_timeout_s is None


def test_overrides_win_over_variables_and_none_means_not_given():
    s = Settings.from_env({"TYPEWRITER_PORT": "9001", "TYPEWRITER_HOST": "0.0.0.0"}, port=9002, host=None)
    assert (s.serving.port, s.serving.host) == (9002, "0.0.0.0")


def test_nothing_is_read_from_the_process_environment_when_a_mapping_is_given(monkeypatch):
    monkeypatch.setenv("TYPEWRITER_PORT", "9999")
    assert Settings.from_env({}).serving.port == 8000
    assert Settings.from_env().serving.port == 9999


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"TYPEWRITER_PORT": "eighty"}, "TYPEWRITER_PORT: must be an integer, got 'eighty'"),
        ({"TYPEWRITER_PORT": "70000"},
         "TYPEWRITER_PORT: must be a port from 0 to 65535 (0 picks a free one), got 70000"),
        ({"TYPEWRITER_MAX_ACTIVE": "0"}, "TYPEWRITER_MAX_ACTIVE: must be at least 1, got 0"),
        ({"TYPEWRITER_MAX_QUEUE": "-1"}, "TYPEWRITER_MAX_QUEUE: must be at least 0, got -1"),
        ({"TYPEWRITER_PING_INTERVAL_S": "inf"}, "TYPEWRITER_PING_INTERVAL_S: must be a finite number"),
        ({"TYPEWRITER_REQUEST_TIMEOUT_S": "soon"}, "TYPEWRITER_REQUEST_TIMEOUT_S: must be a finite number or 'none'"),
        ({"TYPEWRITER_REQUEST_TIMEOUT_S": "0"}, "TYPEWRITER_REQUEST_TIMEOUT_S: must be greater than 0"),
        ({"TYPEWRITER_MAX_NEW_TOKENS": "600", "TYPEWRITER_MAX_NEW_TOKENS_CAP": "500"},
         "TYPEWRITER_MAX_NEW_TOKENS_CAP: must be at least 600"),
        ({"TYPEWRITER_MAX_NEW_TOKENS_CAP": "2048"}, "must be smaller than max_context (2048)"),
        ({"TYPEWRITER_LOG_LEVEL": "loud"}, "TYPEWRITER_LOG_LEVEL: must be one of critical, error, warning"),
        ({"TYPEWRITER_API_KEY_PAGE": "maybe"}, "TYPEWRITER_API_KEY_PAGE: must be true or false, got 'maybe'"),
        ({"TYPEWRITER_QUEUE_TIMEOUT_S": "-5"}, "TYPEWRITER_QUEUE_TIMEOUT_S: must be greater than 0 (or none)"),
        ({"TYPEWRITER_KEEP_FOR_READERS_S": "-1"}, "TYPEWRITER_KEEP_FOR_READERS_S: must be at least 0.0, got -1.0"),
        ({"TYPEWRITER_KEEP_FOR_READERS_S": "86400"}, "TYPEWRITER_KEEP_FOR_READERS_S: must be at most 3600.0"),
        ({"TYPEWRITER_KEEP_FOR_READERS_S": "nan"}, "TYPEWRITER_KEEP_FOR_READERS_S: must be a finite number"),
        ({"TYPEWRITER_DRAFT_TOKENS": "-1"}, "TYPEWRITER_DRAFT_TOKENS: must be at least 0, got -1"),
        ({"TYPEWRITER_DRAFT_TOKENS": "6"}, "TYPEWRITER_DRAFT_TOKENS: must be at most 5, got 6"),
        ({"TYPEWRITER_DRAFT_TOKENS": "two"}, "TYPEWRITER_DRAFT_TOKENS: must be an integer, got 'two'"),
        ({"TYPEWRITER_FRAMES_PER_SECOND": "0"}, "TYPEWRITER_FRAMES_PER_SECOND: must be at least 1, got 0"),
        ({"TYPEWRITER_CLIENT_SYSTEM_PROMPT": "merge"},
         "TYPEWRITER_CLIENT_SYSTEM_PROMPT: must be one of refuse, append, replace, got 'merge'"),
        ({"TYPEWRITER_MAX_ACTIVES": "8"}, "TYPEWRITER_MAX_ACTIVES: not a setting"),
    ],
)
def test_a_bad_value_is_an_error_naming_the_variable(environ, message):
    with pytest.raises(ConfigError) as raised:
        Settings.from_env(environ)
    assert message in str(raised.value)


def test_an_unknown_override_is_a_programming_error():
    with pytest.raises(TypeError, match="unknown settings: colour"):
        Settings.from_env({}, colour="blue")


def test_settings_are_frozen():
    with pytest.raises(AttributeError):
        Settings().serving.port = 1  # type: ignore[misc]


def test_answer_length_limits_follow_a_smaller_context_unless_set():
    small = Settings.of(max_context=512)
    assert (small.answers.length_cap, small.answers.default_length) == (256, 256)
    assert (Settings().answers.length_cap, Settings().answers.default_length) == (1024, 512)
    assert Settings.of(max_context=512, max_new_tokens=100).answers.default_length == 100


def test_the_lite_program_cache_is_on_by_default_beside_the_xla_one_and_off_means_none():
    from typewriter.config import Settings, lite_cache_dir

    assert lite_cache_dir({"XDG_CACHE_HOME": "/c"}) == "/c/typewriter/lite"
    assert lite_cache_dir({}).endswith("/.cache/typewriter/lite") and not lite_cache_dir({}).startswith("~")
    for off in ("off", "none", " ", "OFF"):
        assert lite_cache_dir({"TYPEWRITER_LITE_CACHE": off}) is None
    assert lite_cache_dir({"TYPEWRITER_LITE_CACHE": "/srv/lite"}) == "/srv/lite"
    Settings.from_env({"TYPEWRITER_LITE_CACHE": "/srv/lite"})  # a known variable, not a stray one


def test_the_xla_cache_is_on_by_default_in_the_users_cache_folder_and_none_or_off_means_no_cache(tmp_path):
    from typewriter.config import xla_cache_dir

    assert xla_cache_dir({"XDG_CACHE_HOME": "/c"}) == "/c/typewriter/xla"
    assert xla_cache_dir({}).endswith("/.cache/typewriter/xla") and not xla_cache_dir({}).startswith("~")
    for off in ("", "  ", "none", "OFF"):
        assert xla_cache_dir({"TYPEWRITER_XLA_CACHE": off}) is None
    assert xla_cache_dir({"TYPEWRITER_XLA_CACHE": "~/xla"}).endswith("/xla")
    assert not xla_cache_dir({"TYPEWRITER_XLA_CACHE": "~/xla"}).startswith("~")


def test_tensorflows_environment_is_prepared_once_without_overriding_what_the_user_set(tmp_path):
    from typewriter.runners.xla.tf_env import prepare_environment

    environ = {"TF_CPP_MIN_LOG_LEVEL": "0"}
    prepare_environment(str(tmp_path / "xla"), environ)
    prepare_environment(str(tmp_path / "xla"), environ)
    assert environ["TF_CPP_MIN_LOG_LEVEL"] == "0"
    assert environ["TF_XLA_FLAGS"] == f"--tf_xla_persistent_cache_directory={tmp_path / 'xla'}"
    assert (tmp_path / "xla").is_dir()
    untouched = {}
    prepare_environment(None, untouched)
    assert "TF_XLA_FLAGS" not in untouched and untouched["TF_CPP_MIN_LOG_LEVEL"] == "2"


def test_a_cache_folder_that_cannot_be_made_leaves_the_cache_off_with_one_notice(tmp_path, capsys):
    from typewriter.runners.xla.tf_env import prepare_environment

    (tmp_path / "file").write_text("")
    environ = {}
    prepare_environment(str(tmp_path / "file" / "xla"), environ)
    assert "TF_XLA_FLAGS" not in environ
    assert "cannot be used" in capsys.readouterr().err


def test_quiet_compiles_drops_only_the_cache_read_notice_and_passes_everything_else_through_in_order(capfd):
    import os

    from typewriter.runners.xla.tf_env import quiet_compiles

    with quiet_compiles():
        with quiet_compiles():  # nested, as two compiling threads are
            os.write(2, b"E0000 text_format.cc:378] Error parsing text-format tensorflow.XlaSerializedCacheEntry: "
                        b"2:1: Expected identifier, got: 6\nreal error one\n")
        os.write(2, b"real error two\npartial")
    os.write(2, b" line\n")
    assert capfd.readouterr().err == "real error one\nreal error two\npartial line\n"


def test_quiet_compiles_drops_the_loaders_tuning_flag_false_alarm_but_not_a_missing_instruction_set(capfd):
    import os

    from typewriter.runners.xla.tf_env import quiet_compiles

    def mismatch(feature: str) -> bytes:  # as XLA 2.21's cpu_aot_loader.cc logs it reading a cached program
        return (f"E0000 00:00:1796230146.137988   26298 cpu_aot_loader.cc:220] Loading XLA:CPU AOT result. Target "
                f"machine feature {feature} is not  supported on the host machine. Machine type used for XLA:CPU "
                f"compilation doesn't match the machine type for execution. Compile machine features: [+avx2,"
                f"+prefer-no-scatter,+prefer-no-gather] vs host machine features: [avx2]. This could lead to "
                f"execution errors such as SIGILL.\n").encode()

    with quiet_compiles():
        os.write(2, mismatch("+prefer-no-scatter") + mismatch("+prefer-no-gather") + mismatch("+fast-gather"))
        os.write(2, mismatch("+avx512f"))
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "Target machine feature +avx512f is not" in err


def test_a_true_or_false_setting_reads_the_usual_words():
    assert [Settings.from_env({"TYPEWRITER_API_KEY_PAGE": w}).access.api_key_page for w in ("true", "1", "Yes", "off", "0")] \
        == [True, True, True, False, False]


def test_the_clients_url_variable_beside_the_settings_is_not_refused():
    from typewriter.config import Settings

    assert Settings.from_env({"TYPEWRITER_URL": "http://127.0.0.1:8000", "TYPEWRITER_PORT": "9000"}).serving.port == 9000


def test_an_empty_system_prompt_means_none_and_an_unset_one_the_tutors():
    assert Settings.from_env({"TYPEWRITER_SYSTEM_PROMPT": ""}).answers.system_prompt == ""
    assert Settings.from_env({}).answers.system_prompt is None
    assert Settings.from_env({"TYPEWRITER_MAX_NEW_TOKENS": ""}).answers.default_length == Settings().answers.default_length


def test_each_students_limits_are_the_addresses_unless_set():
    limits = Settings().limits
    assert (limits.chats_per_student, limits.at_once_per_student) == (120, 64)
    set_ = Settings.of(student_chats_per_minute=10, student_chats_at_once=2).limits
    assert (set_.chats_per_student, set_.at_once_per_student) == (10, 2)


def test_address_caps_read_ranges_and_their_caps_in_order():
    assert parse_address_caps(" 10.20.0.0/16=640, 2001:db8::/32=200,") == (
        (ip_network("10.20.0.0/16"), 640), (ip_network("2001:db8::/32"), 200))
    assert Settings.from_env({"TYPEWRITER_ADDRESS_CAPS": "192.168.1.0/24=300"}).limits.address_caps


@pytest.mark.parametrize(("environ", "message"), [
    ({"TYPEWRITER_ADDRESS_CAPS": "10.0.0.0/8"}, "TYPEWRITER_ADDRESS_CAPS: '10.0.0.0/8': the cap after = must be"),
    ({"TYPEWRITER_ADDRESS_CAPS": "school=300"}, "TYPEWRITER_ADDRESS_CAPS: 'school=300': 'school' is not an address"),
    ({"TYPEWRITER_ADDRESS_CAPS": "10.0.0.0/8=0"}, "the cap after = must be a whole number from 1"),
    ({"TYPEWRITER_STUDENT_CHATS_AT_ONCE": "0"}, "TYPEWRITER_STUDENT_CHATS_AT_ONCE: must be at least 1, got 0"),
    ({"TYPEWRITER_IDENTITY_SECRET": "short"}, "TYPEWRITER_IDENTITY_SECRET: must be at least 32 characters"),
    ({"TYPEWRITER_IDENTITIES_PER_MINUTE": "0"}, "TYPEWRITER_IDENTITIES_PER_MINUTE: must be at least 1, got 0"),
    ({"TYPEWRITER_CLASSES": " "}, "TYPEWRITER_CLASSES: must be the path of a classes file"),
])
def test_a_bad_identity_or_limit_setting_is_named(environ, message):
    with pytest.raises(ConfigError) as raised:
        Settings.from_env(environ)
    assert message in str(raised.value)
