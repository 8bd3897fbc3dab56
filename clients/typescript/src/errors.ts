/**
 * Errors: one class for every answer muster refuses, carrying the
 * problem+json fields (RFC 9457), and one for a cluster that could not be
 * reached. Catch by class: `NotFound` (404), `Conflict` (409: a stale
 * fencing token, a taken alias, a busy lock), `Unavailable` (5xx, or no
 * node reached before the retry budget ran out).
 */

/** A problem+json body: the standard fields and whatever the server added. */
export interface Problem {
  type?: string;
  title?: string;
  status?: number;
  detail?: string;
  request_id?: string;
  [extra: string]: unknown;
}

/** A 4xx or 5xx answer from a node. */
export class MusterError extends Error {
  readonly status: number;
  readonly problem: Problem;
  readonly title: string;
  readonly detail: string;
  readonly requestId: string | undefined;
  readonly type: string;
  readonly method: string;
  readonly url: string;

  constructor(status: number, problem: Problem, method = "", url = "") {
    const title = String(problem.title ?? "");
    const detail = String(problem.detail ?? "");
    const rid = typeof problem.request_id === "string" ? problem.request_id : undefined;
    super(`${status} ${title}: ${detail} (${method} ${url}, request ${rid ?? "-"})`);
    this.name = new.target.name;
    this.status = status;
    this.problem = problem;
    this.title = title;
    this.detail = detail;
    this.requestId = rid;
    this.type = String(problem.type ?? "about:blank");
    this.method = method;
    this.url = url;
  }
}

/** 400 or 422: the request was malformed; the detail says how to fix it. */
export class BadRequest extends MusterError {}

/** 401 or 403: no token, a wrong one, or a role too weak for the call. */
export class Unauthorized extends MusterError {}

/** 404. */
export class NotFound extends MusterError {}

/** 409: a stale fencing token, a taken alias, a busy lock, ... */
export class Conflict extends MusterError {}

/** 429: a limit said not now. */
export class TooManyRequests extends MusterError {}

/** Every node answered 5xx (or could not be reached) until the retry budget ran out. */
export class Unavailable extends MusterError {}

/** No node could be reached before the retry budget ran out. */
export class ConnectError extends Unavailable {
  constructor(message: string, method = "", url = "") {
    super(503, { title: "Unreachable", detail: message }, method, url);
  }
}

/** The error class for a status. */
export function errorFor(status: number, problem: Problem, method: string, url: string): MusterError {
  if (status === 404) return new NotFound(status, problem, method, url);
  if (status === 409) return new Conflict(status, problem, method, url);
  if (status === 429) return new TooManyRequests(status, problem, method, url);
  if (status === 401 || status === 403) return new Unauthorized(status, problem, method, url);
  if (status === 400 || status === 422) return new BadRequest(status, problem, method, url);
  if (status >= 500) return new Unavailable(status, problem, method, url);
  return new MusterError(status, problem, method, url);
}
