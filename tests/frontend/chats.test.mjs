import assert from "node:assert/strict";
import { test } from "node:test";

import {
  CHATS_KEY, OLD_KEY, currentChat, deleteChat, droppedNotice, fitChats, loadChats, openChat, renameChat, saveChats,
  startChat, titleOf, touch,
} from "../../frontend/chats.js";

const turn = (question, answer = "an answer", status = "done") => ({ id: "x", question, answer, status, note: "", stats: "" });

class MemoryStorage {
  items = new Map();
  /** refuse values longer than this, like a full localStorage */
  quota = Infinity;
  getItem(k) {
    return this.items.get(k) ?? null;
  }
  setItem(k, v) {
    if (v.length > this.quota) throw new DOMException("full", "QuotaExceededError");
    this.items.set(k, v);
  }
  removeItem(k) {
    this.items.delete(k);
  }
}

/** A list of `n` chats, the first one newest and open, each with one question. */
function chats(n, { chars = 10 } = {}) {
  const list = loadChats(new MemoryStorage(), 0);
  for (let i = 0; i < n; i++) {
    const chat = i === 0 ? currentChat(list) : startChat(list, i);
    chat.turns.push(turn(`question ${i}`, "x".repeat(chars)));
    touch(list, i);
  }
  return list;
}

test("an empty storage gives one empty open chat", () => {
  const list = loadChats(new MemoryStorage(), 5);
  assert.equal(list.chats.length, 1);
  assert.equal(currentChat(list).turns.length, 0);
  assert.equal(titleOf(currentChat(list)), "New chat");
});

test("chats survive a reload: titles, order, the open one, and an unfinished answer as interrupted", () => {
  const storage = new MemoryStorage();
  const list = chats(3);
  renameChat(list, list.chats[2].id, "  Photosynthesis   homework ");
  currentChat(list).turns.push(turn("still writing", "part", "streaming"));
  openChat(list, list.chats[1].id);
  assert.equal(saveChats(storage, list).saved, true);
  const again = loadChats(storage);
  assert.deepEqual(again.chats.map(titleOf), ["question 2", "question 1", "Photosynthesis homework"]);
  assert.equal(again.current, list.chats[1].id);
  assert.equal(again.chats[0].turns[1].status, "interrupted");
});

test("the one conversation an older page kept becomes the first chat, and its old key goes", () => {
  const storage = new MemoryStorage();
  storage.setItem(OLD_KEY, JSON.stringify({ turns: [turn("what is a cell?")] }));
  const list = loadChats(storage);
  assert.deepEqual(list.chats.map(titleOf), ["what is a cell?"]);
  saveChats(storage, list);
  assert.equal(storage.getItem(OLD_KEY), null);
  assert.ok(storage.getItem(CHATS_KEY));
});

test("damaged storage gives a working list, not a broken page", () => {
  const storage = new MemoryStorage();
  storage.setItem(CHATS_KEY, "{nope");
  assert.equal(loadChats(storage).chats.length, 1);
  storage.setItem(CHATS_KEY, JSON.stringify({ current: "gone", chats: [null, { id: 3 }, { id: "a", turns: "x" }, { id: "a" }] }));
  const list = loadChats(storage);
  assert.deepEqual(list.chats.map((c) => c.id), ["a"]);
  assert.equal(list.current, "a");
});

test("over the chat bound, the chats touched longest ago go first, never the open one", () => {
  const list = chats(6);
  openChat(list, list.chats[5].id); // the oldest is open
  const { chats: dropped, turns } = fitChats(list, { maxChats: 3, maxChars: Infinity });
  assert.deepEqual(dropped.map(titleOf), ["question 1", "question 2", "question 3"]);
  assert.equal(turns, 0);
  assert.deepEqual(list.chats.map(titleOf), ["question 5", "question 4", "question 0"]);
});

test("over the size bound, old chats go until the rest fits; then the open chat's oldest turns", () => {
  const list = chats(5, { chars: 1000 });
  const size = JSON.stringify({ current: list.current, chats: list.chats }).length;
  const dropped = fitChats(list, { maxChats: 100, maxChars: size - 1500 });
  assert.equal(dropped.chats.length, 2);
  assert.ok(JSON.stringify({ current: list.current, chats: list.chats }).length <= size - 1500);

  const one = chats(1, { chars: 1000 });
  for (let i = 0; i < 4; i++) currentChat(one).turns.push(turn(`more ${i}`, "y".repeat(1000)));
  const trimmed = fitChats(one, { maxChats: 100, maxChars: 2500 });
  assert.equal(trimmed.turns, 3);
  assert.deepEqual(currentChat(one).turns.map((t) => t.question), ["more 2", "more 3"]);
  const last = fitChats(one, { maxChats: 100, maxChars: 10 });
  assert.deepEqual(currentChat(one).turns.map((t) => t.question), ["more 3"], "the last question stays");
  assert.equal(last.turns, 1);
});

test("a storage that refuses (quota) loses the oldest chats until it takes the rest; the notice says so", () => {
  const storage = new MemoryStorage();
  const list = chats(4, { chars: 2000 });
  storage.quota = 5000;
  const result = saveChats(storage, list);
  assert.equal(result.saved, true);
  assert.deepEqual(result.chats.map(titleOf), ["question 0", "question 1"]);
  assert.equal(loadChats(storage).chats.length, 2);
  assert.equal(droppedNotice(result), "Your 2 oldest chats were removed to make room.");
  assert.equal(droppedNotice({ chats: [list.chats[0]], turns: 0 }), "Your oldest chat, “question 3”, was removed to make room.");
  assert.equal(droppedNotice({ chats: [], turns: 0 }), "");
  storage.quota = 0;
  assert.equal(saveChats(storage, list).saved, false, "nothing fits: the page carries on without memory");
});

test("new, rename and delete", () => {
  const list = chats(2);
  const empty = startChat(list, 10);
  assert.equal(startChat(list, 11), empty, "an empty open chat is reused, not piled up");
  assert.equal(list.chats.length, 3);
  renameChat(list, empty.id, "Algebra");
  assert.equal(titleOf(empty), "Algebra");
  renameChat(list, empty.id, "   ");
  assert.equal(titleOf(empty), "New chat", "an empty name goes back to the first question");
  deleteChat(list, empty.id);
  assert.equal(list.chats.length, 2);
  assert.equal(list.current, list.chats[0].id, "deleting the open chat opens the newest other one");
  deleteChat(list, list.chats[0].id);
  deleteChat(list, list.chats[0].id);
  assert.equal(list.chats.length, 1, "deleting the last chat leaves a new empty one");
  assert.equal(currentChat(list).turns.length, 0);
});

test("a long first question makes a short title", () => {
  const list = chats(0);
  currentChat(list).turns.push(turn("Explain, step by step and with examples, how photosynthesis turns light into sugar in a leaf"));
  const title = titleOf(currentChat(list));
  assert.ok(title.length <= 60 && title.endsWith("…"), title);
});
