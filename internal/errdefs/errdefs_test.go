package errdefs

import (
	"errors"
	"fmt"
	"testing"
)

func TestUserMessageSurvivesWrapping(t *testing.T) {
	err := fmt.Errorf("creating sandbox: %w", New(ErrNotFound, "template %q not found", "x"))
	if !errors.Is(err, ErrNotFound) || errors.Is(err, ErrInvalidArgument) {
		t.Fatal("class lost")
	}
	if UserMessage(err) != `template "x" not found` {
		t.Fatalf("message %q", UserMessage(err))
	}
	if UserMessage(fmt.Errorf("internal: %w", errors.New("disk on fire"))) != "" {
		t.Fatal("internal detail must not become a user message")
	}
}
