// A WebSocket stand-in for the transport's tests: records what the page sends and lets the test play the server.

export class FakeSocket {
  static all = [];
  readyState = 0;
  sent = [];
  constructor(url) {
    this.url = url;
    FakeSocket.all.push(this);
  }
  send(data) {
    this.sent.push(JSON.parse(data));
  }
  close() {
    this.drop();
  }
  open() {
    this.readyState = 1;
    this.onopen?.();
  }
  /** A server message: an object (sent as JSON) or a raw string. */
  receive(msg) {
    this.onmessage?.({ data: typeof msg === "string" ? msg : JSON.stringify(msg) });
  }
  drop(code = 1006, reason = "") {
    this.readyState = 3;
    this.onclose?.({ code, reason });
  }
  static get last() {
    return FakeSocket.all.at(-1);
  }
}
