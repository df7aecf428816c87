package mcpserver

import (
	"encoding/base64"
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cellfork/cellfork/internal/client"
)

var png = []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")

func raw(v string) json.RawMessage { b, _ := json.Marshal(v); return b }

func TestExecutionContent(t *testing.T) {
	res := executionContent(&client.Execution{
		Stdout: "hi\n",
		Results: []client.Result{
			{Formats: map[string]json.RawMessage{"text": raw("<Figure>"), "png": raw(base64.StdEncoding.EncodeToString(png))}},
			{Formats: map[string]json.RawMessage{"text": raw("42")}, IsMainResult: true},
			{Formats: map[string]json.RawMessage{"html": raw("<table/>")}},
		},
	})
	if res.IsError || len(res.Content) != 4 {
		t.Fatalf("content %+v", res.Content)
	}
	if c, ok := res.Content[1].(*mcp.ImageContent); !ok || c.MIMEType != "image/png" || string(c.Data) != string(png) {
		t.Errorf("a plot is not image content: %#v", res.Content[1])
	}
	for i, want := range map[int]string{0: "hi\n", 2: "42", 3: "html:\n<table/>"} {
		if c, ok := res.Content[i].(*mcp.TextContent); !ok || c.Text != want {
			t.Errorf("content %d = %#v, want text %q", i, res.Content[i], want)
		}
	}
	res = executionContent(&client.Execution{Error: &client.ExecutionError{Name: "ZeroDivisionError", Value: "division by zero", Traceback: "tb"}})
	if !res.IsError || res.Content[0].(*mcp.TextContent).Text != "ZeroDivisionError: division by zero\ntb" {
		t.Errorf("error %+v", res.Content)
	}
	if res := executionContent(&client.Execution{}); res.Content[0].(*mcp.TextContent).Text != "(no output)" {
		t.Errorf("empty %+v", res.Content)
	}
}

func TestFileContent(t *testing.T) {
	if _, ok := fileContent("s", "/a.png", png).(*mcp.ImageContent); !ok {
		t.Error("a PNG file is not image content")
	}
	if c, ok := fileContent("s", "/a.txt", []byte("héllo")).(*mcp.TextContent); !ok || c.Text != "héllo" {
		t.Error("a text file is not text content")
	}
	c, ok := fileContent("s1", "/bin/x", []byte{0, 1, 0xff}).(*mcp.EmbeddedResource)
	if !ok || c.Resource.URI != "cellfork://sandboxes/s1/files/bin/x" || len(c.Resource.Blob) != 3 {
		t.Errorf("a binary file: %#v", c)
	}
}
