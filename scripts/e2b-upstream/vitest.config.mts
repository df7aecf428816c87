// vitest configuration for the E2B upstream measurement
// (scripts/e2b-upstream.sh): the JS SDK's own `unit` project settings for
// Node, without its browser project (whose playwright provider is not
// installed), one file at a time against one daemon. Test harness only.
import { defineConfig } from 'vitest/config'

export default defineConfig({
  test: {
    include: ['tests/**/*.test.ts'],
    exclude: ['tests/runtimes/**', 'tests/template/**', 'tests/connectionConfig.test.ts'],
    isolate: true,
    globals: false,
    testTimeout: 30_000,
    environment: 'node',
    setupFiles: ['tests/globalFetchFallback.setup.ts'],
    deps: { interopDefault: true },
    fileParallelism: false,
    env: { ...(process.env as Record<string, string>) },
  },
})
