package promptkey

// Error is why Scan refuses a request body. The engine answers it as an OpenAI invalid_request_error with
// status 400; its fields hold no bytes of the body.
type Error struct {
	// Code is the kind of refusal, as the OpenAI error code: "invalid_json", "invalid_body",
	// "missing_model", "duplicate_model" or "invalid_model".
	Code string
	// Param is the request parameter at fault ("model"), or "".
	Param string
	// Message says what is wrong, for the client.
	Message string
}

func (e *Error) Error() string { return e.Message }

func invalid(code, param, message string) *Error {
	return &Error{Code: code, Param: param, Message: message}
}
