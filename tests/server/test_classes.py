"""The classes file: read once at start, every mistake an error naming the file's line and the field; keys and join
codes name one class each; a class's tutor is the server's system prompt with its own instructions."""

from __future__ import annotations

from pathlib import Path

import pytest
from repo import ROOT

from typewriter.config import ConfigError, Settings
from typewriter.server.classes import DEFAULT, GUIDED, Classes, Tutor, load_classes

EXAMPLE = ROOT / "examples" / "classes.toml"
KEY = "k" * 24


def classes(tmp_path: Path, text: str, **settings) -> Classes:
    path = tmp_path / "classes.toml"
    path.write_text(text)
    return load_classes(Settings.of(classes=str(path), **settings))


def refused(tmp_path: Path, text: str, **settings) -> str:
    with pytest.raises(ConfigError) as raised:
        classes(tmp_path, text, **settings)
    return str(raised.value)


def test_the_example_file_is_read_whole():
    loaded = load_classes(Settings.of(classes=str(EXAMPLE)))
    algebra, biology = loaded.listed
    assert loaded.open and (loaded.default.chats_per_minute, loaded.default.chats_at_once) == (10, 2)
    assert (algebra.name, algebra.weight, algebra.max_tokens, algebra.chats_at_once) == ("Algebra 1", 2.0, 400, 2)
    assert loaded.by_join("alg1-7qx2") is algebra  # any case
    assert loaded.by_key("tw-bio2-Jx0Yq9w3Lr7uVt2KpZcN5e8M").student is None
    ana = loaded.by_key("tw-bio2-ana-6fQe1Hs9Wd3Ky7Rb")
    assert (ana.classroom, ana.student) == (biology, "ana")
    assert loaded.by_key("tw-bio2-ana-6fQe1Hs9Wd3Ky7R") is None and loaded.by_join("ALG1-7QX") is None


def test_without_a_file_there_is_one_default_class_with_the_servers_settings():
    loaded = load_classes(Settings.of(max_context=512, chats_per_minute=30))
    assert loaded.listed == () and loaded.open
    assert (loaded.default.name, loaded.default.max_tokens, loaded.default.chats_per_minute) == (DEFAULT, 256, 30)
    assert loaded.default.tutor.plain


def test_a_class_leaves_out_what_the_server_decides(tmp_path):
    loaded = classes(tmp_path, f'[[class]]\nname = "A"\nkey = "{KEY}"\n', student_chats_at_once=3)
    (a,) = loaded.listed
    assert (a.weight, a.chats_at_once, a.max_tokens) == (1.0, 3, Settings().answers.length_cap)


@pytest.mark.parametrize(("text", "message"), [
    ('[[class]]\nname = "A"\njoin = "ABCDEF"\nweight = 0\n', ":4: class 'A': weight: must be a number greater than 0"),
    ('[[class]]\nname = "A"\njoin = "ABCDEF"\n\n[[class]]\nname = "B"\njoin = "abcdef"\n',
     ":7: class 'B': join: the join code is 'A''s too"),
    (f'[[class]]\nname = "A"\nkey = "{KEY}"\n[[class]]\nname = "B"\nkey = "{KEY}"\n',
     ":6: class 'B': key: this key is given twice"),
    ('[[class]]\nname = "A"\n', ":2: class 'A': name: class 'A' has no key and no join code"),
    ('[[class]]\nname = "A"\njoin = "ABC"\n', ":3: class 'A': join: must be a code of 6 to 32"),
    ('[[class]]\nname = "A"\nkey = "short"\n', ":3: class 'A': key: must be 24 to 256"),
    ('[[class]]\nname = "A"\njoin = "ABCDEF"\nmax_tokens = 5000\n',
     ":4: class 'A': max_tokens: must be a whole number from 1 to the server's max_new_tokens_cap (1024)"),
    ('[[class]]\nname = "A"\njoin = "ABCDEF"\ncolour = "red"\n', ":4: [[class]] #1: colour: not a field of a class"),
    ('[[class]]\nname = "A"\njoin = "ABCDEF"\n[class.tutor]\nsubject = "x"\nguided = "yes"\n',
     ":6: class 'A': tutor.guided: must be true or false"),
    ('[[class]]\nname = "A"\njoin = "ABCDEF"\n[class.tutor]\nvoice = "calm"\n',
     ":5: class 'A': tutor.voice: not a field of tutor"),
    ('[[class]]\nname = "default"\njoin = "ABCDEF"\n', ":2: [[class]] #1: name: 'default' is taken"),
    ('[[class]]\njoin = "ABCDEF"\n', ":1: [[class]] #1: name: must be the class's name"),
    ('[[class]]\nname = "A"\njoin = "ABCDEF"\n[class.students]\nana = "short"\n',
     ":5: class 'A': students.ana: must be the student's API key"),
    ('open = "yes"\n', ":1: open: must be true or false"),
    ('[default]\njoin = "ABCDEF"\n', ":2: default.join: the default class has no name, key, join code"),
    ('[default]\nchats_at_once = 0\n', ":2: default.chats_at_once: must be a whole number from 1"),
    ('[[class]\nname = "A"\n', "not a TOML file: "),
])
def test_a_mistake_is_named_by_line_and_field(tmp_path, text, message):
    error = refused(tmp_path, text)
    assert error.startswith(str(tmp_path / "classes.toml")) and message in error, error


def test_a_toml_syntax_error_says_its_line(tmp_path):
    assert "line 2" in refused(tmp_path, 'open = true\nname = \n')


def test_a_class_key_cannot_be_the_servers_own_key(tmp_path):
    assert "or is the server's API_KEY" in refused(tmp_path, f'[[class]]\nname = "A"\nkey = "{KEY}"\n', api_key=KEY)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="none.toml: cannot read the classes file: No such file"):
        load_classes(Settings.of(classes=str(tmp_path / "none.toml")))


def test_a_tutor_adds_its_subject_language_and_guided_steps_to_the_servers_prompt():
    tutor = Tutor(subject="chemistry", language="French", guided=True)
    prompt = tutor.system_prompt("Be a tutor.")
    assert prompt.startswith("Be a tutor. You tutor chemistry") and "Always answer in French" in prompt
    assert prompt.endswith(GUIDED)
    assert Tutor(prompt="Only riddles.").system_prompt("Be a tutor.") == "Only riddles."
    assert Tutor().system_prompt("") == ""
